// 30 layers x 4 matrices of the default model's packed sizes, read by 2 threads (each half of each matrix,
// a barrier after each) against the same bytes as one contiguous read split in two.
//   gcc -O2 -mavx512f -fopenmp -o matrices_read matrices_read.c && ./matrices_read
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static __m512i rd(const char* p, size_t n, int pf) {
  __m512i acc = _mm512_setzero_si512();
  for (size_t i = 0; i < n; i += 64) {
    if (pf) _mm_prefetch(p + i + pf, _MM_HINT_T0);
    acc = _mm512_add_epi32(acc, _mm512_load_si512(p + i));
  }
  return acc;
}
int main() {
  size_t sz[4] = {960 * 576 / 32 * 20, 576 * 576 / 32 * 20, 3072 * 576 / 32 * 20, 576 * 1536 / 32 * 20};
  size_t total = 0; for (int i = 0; i < 4; ++i) total += sz[i] * 30;
  char* buf = aligned_alloc(4096, total + (1 << 20));
  for (size_t i = 0; i < total + (1 << 20); ++i) buf[i] = i;
  char* flush = aligned_alloc(64, 200 << 20); for (size_t i = 0; i < (200u << 20); ++i) flush[i] = i;
  printf("total %.1f MB\n", total / 1e6);
  for (int pf = 0; pf <= 4096; pf += 4096)
  for (int rep = 0; rep < 3; ++rep) {
    double t_small = 0, t_big = 0; __m512i s = _mm512_setzero_si512();
    for (int r = 0; r < 10; ++r) {
      s = _mm512_add_epi32(s, rd(flush, 200 << 20, 0));
      double t0 = now();
#pragma omp parallel num_threads(2)
      {
        int me = omp_get_thread_num(); __m512i a = _mm512_setzero_si512(); size_t off = 0;
        for (int l = 0; l < 30; ++l) for (int m = 0; m < 4; ++m) {
          size_t h = (sz[m] / 2) & ~63ul;
          a = _mm512_add_epi32(a, rd(buf + off + me * h, me ? sz[m] - h : h, pf));
          off += sz[m];
#pragma omp barrier
        }
        if (_mm512_reduce_add_epi32(a) == 7) printf("x");
      }
      double t1 = now();
      s = _mm512_add_epi32(s, rd(flush, 200 << 20, 0));
      double t2 = now();
#pragma omp parallel num_threads(2)
      {
        int me = omp_get_thread_num(); size_t h = (total / 2) & ~63ul;
        __m512i a = rd(buf + me * h, me ? total - h : h, pf);
        if (_mm512_reduce_add_epi32(a) == 7) printf("x");
      }
      double t3 = now();
      t_small += t1 - t0, t_big += t3 - t2;
    }
    printf("prefetch %d: 120 matrices, a barrier each: %.2f ms (%.1f GB/s); one read: %.2f ms (%.1f GB/s)\n", pf,
           t_small / 10 * 1e3, total / (t_small / 10) / 1e9, t_big / 10 * 1e3, total / (t_big / 10) / 1e9);
  }
}
