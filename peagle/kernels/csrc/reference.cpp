// The scalar references, code of their own: a SIMD path's lane order and FMAs (``lanes`` its width), one
// output at a time. Also the scalar instruction set's paths: the SIMD tiles over plain C++ lanes (Lanes<8>),
// which the tests tie to the references as they tie every SIMD path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include <c10/util/Half.h>

#include "attention_tiles.h"
#include "kernels.h"
#include "linear_tiles.h"

namespace peagle {
namespace {

// Vector traits in plain C++: L lanes, lane l of a dot product summing elements l, l+L, ... (fmaf).
template <int L>
struct Lanes {
  static constexpr int LANES = L;
  static constexpr int RMAX = 4, RWIDE = 4;
  static constexpr int columns(int) { return 2; }
  struct vec {
    float v[L];
  };
  template <WType T>
  static vec load_w(const uint8_t* row, int64_t k) {
    vec r;
    for (int i = 0; i < L; ++i) r.v[i] = weight_at(row, T, k + i);
    return r;
  }
  template <WType T>
  static vec load_w_tail(const uint8_t* row, int64_t k, int64_t n) {
    vec r{};
    for (int i = 0; i < n; ++i) r.v[i] = weight_at(row, T, k + i);
    return r;
  }
  template <WType T>
  static void load_block(const uint8_t* row, int64_t b, vec* out) {
    float chunk[QBLOCK];
    chunk_values<T>(row, b, chunk);
    for (int s = 0; s < QBLOCK / L; ++s) std::memcpy(out[s].v, chunk + s * L, sizeof out[s].v);
  }
  static vec zero() { return vec{}; }
  static vec load_x(const float* p) {
    vec r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static vec load_x_tail(const float* p, int64_t n) {
    vec r{};
    std::memcpy(r.v, p, n * 4);
    return r;
  }
  static vec load_h(const uint16_t* p) {
    vec r;
    for (int i = 0; i < L; ++i) r.v[i] = half_to_float(p[i]);
    return r;
  }
  static vec fma(vec a, vec b, vec c) {
    for (int i = 0; i < L; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return c;
  }
  static float hsum(vec x) {  // lane l+8 into lane l (16 lanes), then ((0+4)+(2+6)) + ((1+5)+(3+7))
    if (L == 16)
      for (int i = 0; i < 8; ++i) x.v[i] += x.v[i + 8];
    return ((x.v[0] + x.v[4]) + (x.v[2] + x.v[6])) + ((x.v[1] + x.v[5]) + (x.v[3] + x.v[7]));
  }
  static vec set1(float x) {
    vec r;
    std::fill(r.v, r.v + L, x);
    return r;
  }
  static vec add(vec a, vec b) {
    for (int i = 0; i < L; ++i) a.v[i] += b.v[i];
    return a;
  }
  static vec sub(vec a, vec b) {
    for (int i = 0; i < L; ++i) a.v[i] -= b.v[i];
    return a;
  }
  static float max_of(const float* p, int64_t n) {
    float r = p[0];
    for (int64_t i = 1; i < n; ++i) r = std::max(r, p[i]);
    return r;
  }
  static vec mul(vec a, vec b) {
    for (int i = 0; i < L; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static vec div(vec a, vec b) {
    for (int i = 0; i < L; ++i) a.v[i] /= b.v[i];
    return a;
  }
  static vec hsum_many(const vec* x) {
    vec r;
    for (int i = 0; i < L; ++i) r.v[i] = hsum(x[i]);
    return r;
  }
  static vec mask_n(vec x, int64_t c) {
    std::fill(x.v + c, x.v + L, 0.f);
    return x;
  }
  static void store_n(float* p, vec x, int64_t c) { std::memcpy(p, x.v, c * 4); }
  static void store_lanes(float* p, vec x, int first, int c) { std::memcpy(p, x.v + first, c * 4); }
  static float exp1(float x) { return exp_scalar(x); }
  static vec exp(vec x) {
    for (int i = 0; i < L; ++i) x.v[i] = exp_scalar(x.v[i]);
    return x;
  }
  static void scale(float* acc, float c, int64_t d) {
    for (int64_t e = 0; e < d; ++e) acc[e] *= c;
  }
};

}  // namespace

float half_to_float(uint16_t h) {  // IEEE half to float, subnormals included
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    b |= sign;
    std::memcpy(&f, &b, 4);
    return f;
  }
  uint32_t bits = sign | (exp == 31 ? (0xffu << 23) | (man << 13) : ((exp + 112) << 23) | (man << 13));
  std::memcpy(&f, &bits, 4);
  return f;
}

static float bf16_to_float(uint16_t h) {  // a float's top half
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float weight_at(const uint8_t* row, WType t, int64_t k) {
  switch (t) {
    case WType::f32: return reinterpret_cast<const float*>(row)[k];
    case WType::bf16: return bf16_to_float(reinterpret_cast<const uint16_t*>(row)[k]);
    case WType::f16: return half_to_float(reinterpret_cast<const uint16_t*>(row)[k]);
    default: {
      float chunk[QBLOCK];
      chunk_values(row, t, k / QBLOCK, chunk);
      return chunk[k % QBLOCK];
    }
  }
}

// f(std::integral_constant<WType, T>) for a block format t known at run time.
template <class F>
static auto by_format(WType t, F f) {
  switch (t) {
    case WType::q8_0: return f(std::integral_constant<WType, WType::q8_0>());
    case WType::q4_0: return f(std::integral_constant<WType, WType::q4_0>());
    case WType::q4_1: return f(std::integral_constant<WType, WType::q4_1>());
    case WType::q5_0: return f(std::integral_constant<WType, WType::q5_0>());
    case WType::q5_1: return f(std::integral_constant<WType, WType::q5_1>());
    case WType::q4_k: return f(std::integral_constant<WType, WType::q4_k>());
    case WType::q5_k: return f(std::integral_constant<WType, WType::q5_k>());
    default: return f(std::integral_constant<WType, WType::q6_k>());
  }
}

SubBlock sub_block(const uint8_t* row, WType t, int64_t c) {
  return by_format(t, [&](auto T) { return sub_block<T.value>(row, c); });
}

void chunk_values(const uint8_t* row, WType t, int64_t c, float* out) {
  by_format(t, [&](auto T) { chunk_values<T.value>(row, c, out); });
}

void linear_ref(const LinearArgs& a, int64_t n0, int64_t n1, int lanes) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const int64_t RB = row_bytes(a.wtype, a.K);
  for (int64_t m = 0; m < a.M; ++m) {
    const float* x = a.x + m * a.ldx;
    for (int64_t n = n0; n < n1; ++n) {
      float lane[16] = {0};
      for (int64_t k = 0; k < a.K; ++k) lane[k % lanes] = std::fmaf(weight_at(w + n * RB, a.wtype, k), x[k], lane[k % lanes]);
      if (lanes == 16)
        for (int l = 0; l < 8; ++l) lane[l] += lane[l + 8];
      float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
      a.y[m * a.ldy + n] = a.bias ? s + a.bias[n] : s;
    }
  }
}

void quantize_rows_ref(const float* x, int64_t ldx, int64_t K, int64_t span, int32_t offset, const QRows& out,
                       int64_t m0, int64_t m1) {
  const int64_t nb = K / QBLOCK;
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t b0 = 0; b0 < K; b0 += span) {
      const float* v = x + m * ldx + b0;
      float amax = 0.f;
      for (int i = 0; i < span; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
      for (int64_t b = b0 / QBLOCK; b < (b0 + span) / QBLOCK; ++b) {
        int32_t s = 0, s16 = 0;
        for (int i = 0; i < QBLOCK; ++i) {
          const int q = int(std::nearbyint(x[m * ldx + b * QBLOCK + i] * id));
          out.q[m * K + b * QBLOCK + i] = int8_t(q);
          s += q;
          if (i == 15) s16 = s;
        }
        out.d[m * nb + b] = d;
        out.sd[m * nb + b] = d * float(s);
        out.c[m * nb + b] = -offset * s;
        out.c16[m * nb + b] = -offset * s16;
        out.s[m * nb + b] = float(s);
      }
    }
}

// The integer path from the file's blocks (kernels.h), one output at a time.
void qlinear_ref(const QLinearArgs& a, int64_t n0, int64_t n1) {
  const int64_t nb = a.K / QBLOCK, RB = row_bytes(a.wtype, a.K);
  const PackedFormat f = packed_format(a.wtype);
  const bool super = super_packed(a.wtype);
  for (int64_t m = 0; m < a.M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* row = a.w + n * RB;
      float acc = 0.f, fs = 0.f;
      int32_t mins = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const SubBlock w = sub_block(row, a.wtype, b);
        const int8_t* xq = a.x.q + m * a.K + b * QBLOCK;
        const float dx = a.x.d[m * nb + b];
        int32_t isum[2] = {0, 0};
        for (int k = 0; k < QBLOCK; ++k) isum[k / 16] += int32_t(w.q[k]) * int32_t(xq[k]);
        if (super) {  // Q8_K's: integer scales a chunk, one float scaling a super-block
          if (b % 8 == 0) fs = 0.f, mins = 0;
          if (f.scales == 2) {
            fs = std::fma(float(w.sc[0]), float(isum[0]), fs);
            fs = std::fma(float(w.sc[1]), float(isum[1]), fs);
          } else {
            fs = std::fma(float(w.sc[0]), float(isum[0] + isum[1]), fs);
          }
          mins += w.mn * int32_t(a.x.s[m * nb + b]);
          if (b % 8 == 7) {
            acc = std::fma(w.d, dx * fs, acc);
            if (f.min) acc = std::fma(-w.dmin, dx * float(mins), acc);
          }
          continue;
        }
        if (f.scales == 2) {
          acc = std::fma(w.s[0], dx * float(isum[0]), acc);
          acc = std::fma(w.s[1], dx * float(isum[1]), acc);
        } else {
          acc = std::fma(w.s[0], dx * float(isum[0] + isum[1]), acc);
        }
        if (f.min) acc = std::fma(w.m, a.x.sd[m * nb + b], acc);
      }
      a.y[m * a.ldy + n] = a.bias ? acc + a.bias[n] : acc;
    }
}

// The bf16 path's conversion of x (kernels.h), one value at a time.
static uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t(u >> 16 | 0x40);  // NaN: quieted
  if ((u & 0x7f800000) == 0) return uint16_t(u >> 16 & 0x8000);        // zero, denormal: a signed zero
  return uint16_t((u + 0x7fff + (u >> 16 & 1)) >> 16);                  // nearest, ties to even (past the max: inf)
}

void bf16_rows_ref(const float* x, int64_t ldx, int64_t K, uint16_t* out, int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t k = 0; k < K; ++k) out[m * K + k] = float_to_bf16(x[m * ldx + k]);
}

// The bf16 path from the plain matrix (kernels.h), one output at a time: vdpbf16ps's lane in scalar steps.
void bf16linear_ref(const BLinearArgs& a, int64_t n0, int64_t n1) {
  const auto daz = [](float v) { return std::fabs(v) < std::numeric_limits<float>::min() ? std::copysign(0.f, v) : v; };
  const auto value = [&](const uint16_t* p, int64_t k) { return daz(bf16_to_float(p[k])); };
  const uint16_t* w = reinterpret_cast<const uint16_t*>(a.w);
  for (int64_t m = 0; m < a.M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      const uint16_t *x = a.x + m * a.K, *row = w + n * a.K;
      float acc = 0.f;
      for (int64_t k = 0; k < a.K; k += 2) {
        acc = daz(std::fma(value(row, k + 1), value(x, k + 1), acc));
        acc = daz(std::fma(value(row, k), value(x, k), acc));
      }
      a.y[m * a.ldy + n] = a.bias ? acc + a.bias[n] : acc;
    }
}

void argmax_row_ref(const float* r, int64_t n, float* value, int64_t* index) {
  float m = r[0], zero = 0.f;
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    zero += r[i] - r[i];
    if (r[i] > m) m = r[i], at = i;
  }
  *value = zero == 0.f ? m : std::numeric_limits<float>::quiet_NaN();
  *index = at;
}

void norm_row_ref(const float* x, const float* w, float eps, int64_t n, float* y) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) lane[i % 8] += x[i] * x[i];
  const float ss = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  const float r = 1.f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * r) * w[i];
}

void half_row_ref(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = c10::Half(x[i]).x;
}

// One element at a time, code of its own (not silu_mul_rows over Lanes: a fault in that template's walk, tails or
// arithmetic shows against it); exp_scalar's bits, which tests/test_kernels.py ties to float64.
void silu_mul_ref(const float* gu, float* out, int64_t n, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t i = 0; i < n; ++i) {
      const float gate = gu[t * 2 * n + i], up = gu[t * 2 * n + n + i];
      out[t * n + i] = gate / (1.f + exp_scalar(-gate)) * up;
    }
}

void linear_scalar(const LinearArgs& a, int64_t n0, int64_t n1) { dispatch_wtype<Lanes<8>>(a, n0, n1); }

void attention_scalar(const AttnArgs& a, int64_t i0, int64_t i1) { attention_items<Lanes<8>>(a, i0, i1); }

// One query head of one row, as kernels.h states attention: its logical keys lo .. p (a window's, through
// the row's tree map from its base on) in KEY_BLOCK blocks aligned to absolute positions; per block the
// scores (linear_ref's lane-order dot products, times the scale), their max with the running one, the
// weights exp(s - max) summed in ``lanes`` lanes from the row's first key of the block, then the running
// sum and outputs rescaled and the block's values added key by key. No tiles: a row alone.
static void attend_row(const AttnArgs& a, int64_t row, int64_t h, int64_t gi, int lanes) {
  const int64_t g = a.H / a.Hkv, d = a.d, qh = h * g + gi, p = a.pos[row];
  const int64_t lo = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0, hi = p + 1;
  const int64_t base = a.tree_base != nullptr ? a.tree_base[row] : hi;
  const int64_t* blocks = a.table + a.seq[row] * a.table_stride;
  const float* q = a.q + row * a.q_stride + qh * d;
  auto at = [&](const void* pool, int64_t row, int64_t e) {  // a pool's element as float32 (half: converted)
    return a.kv_half ? half_to_float(static_cast<const uint16_t*>(pool)[row * d + e]) : static_cast<const float*>(pool)[row * d + e];
  };
  auto slot = [&](int64_t j) {  // logical key j's row in the pools
    const int64_t key = j < base ? j : a.tree_map[row * a.tree_stride + j - base];
    return (blocks[key / a.block_size] * a.block_size + key % a.block_size) * a.Hkv + h;
  };
  float m = a.sinks ? a.sinks[qh] : -std::numeric_limits<float>::infinity(), l = a.sinks ? 1.f : 0.f;
  float acc[MAX_HEAD_DIM] = {0}, s[KEY_BLOCK];
  for (int64_t j0 = lo - lo % KEY_BLOCK; j0 < hi; j0 += KEY_BLOCK) {
    const int64_t jb = std::max(j0, lo), n = std::min(j0 + KEY_BLOCK, hi) - jb;
    float mb = m;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = slot(jb + j);
      float lane[16] = {0};
      for (int64_t e = 0; e < d; ++e) lane[e % lanes] = std::fmaf(q[e], at(a.k, k, e), lane[e % lanes]);
      if (lanes == 16)
        for (int i = 0; i < 8; ++i) lane[i] += lane[i + 8];
      s[j] = (((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]))) * a.scale;
      mb = std::max(mb, s[j]);
    }
    const float corr = exp_scalar(m - mb);
    float sum[16] = {0};
    for (int64_t j = 0; j < n; ++j) {
      s[j] = exp_scalar(s[j] - mb);
      sum[j % lanes] += s[j];
    }
    if (lanes == 16)
      for (int i = 0; i < 8; ++i) sum[i] += sum[i + 8];
    l = l * corr + (((sum[0] + sum[4]) + (sum[2] + sum[6])) + ((sum[1] + sum[5]) + (sum[3] + sum[7])));
    for (int64_t e = 0; e < d; ++e) acc[e] *= corr;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t v = slot(jb + j);
      for (int64_t e = 0; e < d; ++e) acc[e] = std::fmaf(s[j], at(a.v, v, e), acc[e]);
    }
    m = mb;
  }
  for (int64_t e = 0; e < d; ++e) a.out[row * a.H * d + qh * d + e] = acc[e] / l;
}

void attention_ref(const AttnArgs& a, int64_t i0, int64_t i1, int lanes) {
  const int64_t g = a.H / a.Hkv;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t t = i / (a.Hkv * a.parts), h = i / a.parts % a.Hkv, part = i % a.parts;
    for (int64_t r = a.tiles[t]; r < a.tiles[t + 1]; ++r)
      for (int64_t gi = part * g / a.parts; gi < (part + 1) * g / a.parts; ++gi) attend_row(a, a.rows[r], h, gi, lanes);
  }
}

}  // namespace peagle
