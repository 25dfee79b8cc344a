// vdpbf16ps on random lanes (denormal inputs among them) against three scalar candidates: the first (fma, odd element first, DAZ/FTZ) is the one kernels.h states.
#pragma GCC target("avx512f,avx512bf16,avx512bw,avx512vl")
#include <immintrin.h>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <random>
#include <cmath>
static float daz(float x){return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.f,x) : x;}
static float bf(uint16_t h){uint32_t u=uint32_t(h)<<16; float f; memcpy(&f,&u,4); return daz(f);}
int main(){
  std::mt19937 g(2); std::normal_distribution<float> n(0,1);
  int bad[3]={0}; int N=200000;
  for(int it=0;it<N;++it){
    uint16_t a[32],b[32]; float acc[16];
    for(int i=0;i<32;i++){float x=n(g)*std::pow(2.f,-int(g()%140)); uint32_t u; memcpy(&u,&x,4); a[i]=u>>16; x=n(g)*std::pow(2.f,int(g()%20)-10); memcpy(&u,&x,4); b[i]=u>>16;}
    for(int i=0;i<16;i++) acc[i]=n(g)*std::pow(2.f,-int(g()%140));
    __m512 r=_mm512_dpbf16_ps(_mm512_loadu_ps(acc),(__m512bh)_mm512_loadu_si512(a),(__m512bh)_mm512_loadu_si512(b));
    float out[16]; _mm512_storeu_ps(out,r);
    for(int j=0;j<16;j++){
      float a0=bf(a[2*j]),a1=bf(a[2*j+1]),b0=bf(b[2*j]),b1=bf(b[2*j+1]);
      float e1=daz(std::fmaf(a0,b0,daz(std::fmaf(a1,b1,daz(acc[j])))));
      float e2=daz(std::fmaf(a0,b0,daz(std::fmaf(a1,b1,acc[j]))));
      float e3=daz(daz(acc[j]+daz(a1*b1))+daz(a0*b0));
      float es[3]={e1,e2,e3};
      for(int k=0;k<3;k++) if(memcmp(&es[k],&out[j],4)) bad[k]++;
    }
  }
  printf("of %d: fma daz-acc %d | fma no-daz-acc %d | unfused %d\n",N*16,bad[0],bad[1],bad[2]);
}
