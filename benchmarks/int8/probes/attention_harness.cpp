#include "avx512.cpp"
#include <chrono>
#include <vector>
#include <random>
#include <cstdio>
using namespace peagle;
int main(int argc, char** argv) {
  const int64_t d = 64, H = 9, Hkv = 3, bs = 16, ctx = 256, R = atoi(argv[1]);
  const int64_t nb = ctx / bs + 2;
  std::vector<float> k(nb * bs * Hkv * d), v(nb * bs * Hkv * d), q(R * H * d), out(R * H * d);
  std::mt19937 rng(0); std::normal_distribution<float> N;
  for (auto& x : k) x = N(rng); for (auto& x : v) x = N(rng); for (auto& x : q) x = N(rng);
  std::vector<int64_t> table(nb), seq(R, 0), pos(R), rows(R), tiles{0, R};
  for (int i = 0; i < nb; ++i) table[i] = i;
  for (int i = 0; i < R; ++i) { pos[i] = ctx - R + i; rows[i] = i; }
  AttnArgs a{q.data(), H * d, k.data(), v.data(), table.data(), nb, rows.data(), tiles.data(), seq.data(), pos.data(),
             nullptr, nullptr, 0, nullptr, out.data(), H, Hkv, d, bs, 0, 0.125f};
  double best = 1e9;
  for (int it = 0; it < 2000; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    attention_avx512(a, 0, Hkv);
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  printf("R=%ld %.1f us\n", R, best);
}
