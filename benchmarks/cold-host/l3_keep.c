// Does a read of 64 MB with prefetchnta leave a smaller buffer A in L3, where normal loads evict it? A read
// (normal loads) after B read normally, after B read with prefetchnta 2 KB ahead, and after nothing.
//   gcc -O2 -mavx512f -o l3_keep l3_keep.c && for s in 8 16 24; do ./l3_keep $s; done
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static __m512i read_normal(const char* p, size_t n) {
  __m512i acc = _mm512_setzero_si512();
  for (size_t i = 0; i < n; i += 64) acc = _mm512_add_epi32(acc, _mm512_load_si512(p + i));
  return acc;
}
static __m512i read_nta(const char* p, size_t n, int dist) {
  __m512i acc = _mm512_setzero_si512();
  for (size_t i = 0; i < n; i += 64) {
    _mm_prefetch(p + i + dist, _MM_HINT_NTA);
    acc = _mm512_add_epi32(acc, _mm512_load_si512(p + i));
  }
  return acc;
}
int main(int argc, char** argv) {
  size_t A = (size_t)atoi(argv[1]) << 20, B = 64ull << 20;
  char *a = aligned_alloc(64, A), *b = aligned_alloc(64, B + 65536);
  for (size_t i = 0; i < A; i++) a[i] = i; for (size_t i = 0; i < B + 65536; i++) b[i] = i;
  __m512i sink = _mm512_setzero_si512();
  for (int mode = 0; mode < 3; ++mode) {
    double ta = 0, tb = 0; int reps = 20;
    for (int r = 0; r < reps + 2; ++r) {
      double t0 = now(); sink = _mm512_add_epi32(sink, read_normal(a, A)); double t1 = now();
      if (mode == 0) sink = _mm512_add_epi32(sink, read_normal(b, B));
      else if (mode == 1) sink = _mm512_add_epi32(sink, read_nta(b, B, 2048));
      double t2 = now();
      if (r >= 2) ta += t1 - t0, tb += t2 - t1;
    }
    printf("A %zu MB after B read %s: A %.1f GB/s, B %.1f GB/s\n", A >> 20, mode == 0 ? "normal" : mode == 1 ? "prefetchnta" : "(none)",
           A / (ta / reps) / 1e9, mode == 2 ? 0.0 : B / (tb / reps) / 1e9);
  }
  int out[16]; _mm512_storeu_si512(out, sink); return out[0] == 12345;
}
