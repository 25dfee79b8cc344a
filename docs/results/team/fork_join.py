"""What splitting a range over two threads costs with nothing to do (BENCHMARKS.md §34): at::parallel_for (an
OpenMP region forked and joined), an OpenMP barrier inside one region, and a spinning counter barrier on one
cache line (what team.h's job board does), microseconds each, three runs of 50,000.

    python docs/results/team/fork_join.py
"""
import tempfile

import torch
from torch.utils.cpp_extension import load_inline

SRC = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <atomic>
#include <chrono>
using clk = std::chrono::steady_clock;
static double us(clk::time_point t, int64_t n) { return std::chrono::duration<double>(clk::now() - t).count() / n * 1e6; }
double regions(int64_t n) {
  std::vector<double> sink(64, 0); auto t = clk::now();
  for (int64_t i = 0; i < n; ++i) at::parallel_for(0, 2, 1, [&](int64_t a, int64_t b) { sink[a * 8] += 1; });
  return us(t, n);
}
double barriers(int64_t n) {
  std::vector<double> sink(64, 0); auto t = clk::now();
  #pragma omp parallel num_threads(at::get_num_threads())
  { int me = omp_get_thread_num();
    for (int64_t i = 0; i < n; ++i) { sink[me * 8] += 1;
      #pragma omp barrier
    } }
  return us(t, n);
}
double spin_barriers(int64_t n) {
  std::vector<double> sink(64, 0); alignas(64) static std::atomic<int64_t> arrived{0};
  arrived = 0; auto t = clk::now(); int nt = at::get_num_threads();
  #pragma omp parallel num_threads(nt)
  { int me = omp_get_thread_num();
    for (int64_t i = 0; i < n; ++i) { sink[me * 8] += 1;
      int64_t target = (i + 1) * nt; arrived.fetch_add(1);
      while (arrived.load(std::memory_order_acquire) < target) __builtin_ia32_pause();
    } }
  return us(t, n);
}
'''
with tempfile.TemporaryDirectory() as build:
    m = load_inline("fork_join", cpp_sources=SRC, functions=["regions", "barriers", "spin_barriers"],
                    extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"], build_directory=build)
    torch.set_num_threads(2)
    for name in ("regions", "barriers", "spin_barriers"):
        getattr(m, name)(2000)
        print(f"{name}: " + ", ".join(f"{getattr(m, name)(50000):.3f}" for _ in range(3)) + " us each")
