// vdpbf16ps near the denormal boundary: results that round to or from FLT_MIN, and exact cancellation.
#pragma GCC target("avx512f,avx512bf16,avx512bw,avx512vl")
#include <immintrin.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <random>
static float daz(float x){return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.f,x) : x;}
static float bf(uint16_t h){uint32_t u=uint32_t(h)<<16; float f; memcpy(&f,&u,4); return daz(f);}
static uint16_t tobf(float f){uint32_t u; memcpy(&u,&f,4); return u>>16;}
int main(){
  std::mt19937 g(7); std::uniform_real_distribution<float> U(1,2);
  long bad=0, n=0, near=0;
  for(int it=0;it<300000;++it){
    uint16_t a[32],b[32]; float acc[16];
    for(int j=0;j<16;j++){
      // products around 2^-126: a ~ 2^-63 * [1,2), b ~ 2^-63 * [1,2); acc = -(one product) +- a few ulps, or near FLT_MIN
      float a0=std::ldexp(U(g),-63-int(g()%3)), b0=std::ldexp(U(g),-63-int(g()%3)) * (g()%2?1:-1);
      float a1=std::ldexp(U(g),-63-int(g()%3)), b1=std::ldexp(U(g),-63-int(g()%3)) * (g()%2?1:-1);
      a[2*j]=tobf(a0); b[2*j]=tobf(b0); a[2*j+1]=tobf(a1); b[2*j+1]=tobf(b1);
      switch(g()%3){
        case 0: acc[j]=std::ldexp(U(g),-126)*(g()%2?1:-1); break;
        case 1: acc[j]=-std::fmaf(bf(a[2*j+1]),bf(b[2*j+1]),0.f)*std::ldexp(1.f, int(g()%3)-1); break;
        default: acc[j]=std::nextafter(1.17549435e-38f, (g()%2)?1.f:0.f)*(g()%2?1:-1);
      }
    }
    __m512 r=_mm512_dpbf16_ps(_mm512_loadu_ps(acc),(__m512bh)_mm512_loadu_si512(a),(__m512bh)_mm512_loadu_si512(b));
    float out[16]; _mm512_storeu_ps(out,r);
    for(int j=0;j<16;j++){
      float a0=bf(a[2*j]),a1=bf(a[2*j+1]),b0=bf(b[2*j]),b1=bf(b[2*j+1]);
      float t=daz(std::fmaf(a1,b1,daz(acc[j])));
      float e=daz(std::fmaf(a0,b0,t));
      n++; if (std::fabs(t) < 2.4e-38f || std::fabs(e) < 2.4e-38f) near++;
      if(memcmp(&e,&out[j],4)) { if(bad++<5) printf("mismatch %a %a\n", e, out[j]); }
    }
  }
  printf("%ld lanes (%ld with a step within 2x of FLT_MIN): %ld mismatches\n", n, near, bad);
}
