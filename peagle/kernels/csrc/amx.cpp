// AMX (Intel Xeon since Sapphire Rapids): AMX-INT8 tiles for the integer path's products, AMX-BF16 tiles for
// the bf16 dot-product path's (kernels.h).
//
// AMX-INT8.
// A packed vector (16 columns x 4 weights, kernels.h's layout) is one 64-byte row of a B tile, so a chunk of
// 32 weights is a B tile of 8 rows; the rows' 8-bit activations of that chunk are an A tile (up to 16 rows x 32
// bytes); tdpbsud (int8 x uint8 into int32) gives every row's integer sum of the chunk at once, exact; the float
// epilogue is AVX512-VNNI's (vnni_tiles.h), in its order: a row's bits are the reference's, whatever the pass.
// Passes of one row stay on AVX512-VNNI (a row reads each weight once either way), and so does q6_k (two sums a
// chunk). The tile unit is a template parameter: AmxUnit runs the instructions; AmxModel is a plain C++ model of
// them (Intel's pseudo-code, and the shape rules the hardware faults on, checked), so the kernel around them is
// tested bit for bit on any AVX512-VNNI CPU (tests/test_int8.py); on an AMX CPU `python -m peagle.kernels` also
// probes the real one against the reference and times it before it is chosen (peagle/kernels/__init__.py).
//
// AMX-BF16. The packed bf16 layout's 64-byte vector (16 columns x one k pair) is one row of a B tile, so 16
// pairs of a group are a B tile; 16 pairs of up to 16 rows' activations an A tile; tdpbf16ps adds each pair's
// products into float32 sums, one rounding each (Intel's pseudo-code: the even element first, where vdpbf16ps
// and kernels.h's arithmetic add the odd first). Both tiles' pairs are swapped (a 16-bit rotate of each dword),
// so the tiles do kernels.h's arithmetic in its order: a row's bits are the reference's and AVX512_BF16's, which
// one-row passes keep. Whether the hardware does its pseudo-code, the set-up's probe checks before it is chosen.
#pragma GCC target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cpuid.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "vnni_tiles.h"
#include "zmm.h"

namespace peagle {

// CPUID leaf 7's EDX bit `feature` (22 AMX-BF16, 25 AMX-INT8), with the tiles (AMX-TILE, bit 24) granted. Asked
// once (ops.cpp's has_avxvnni says why): best_bf16_isa asks at every bf16 linear.
static bool amx_has(int feature) {
  static const unsigned edx = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1)) return 0u;  // AMX-TILE
    const unsigned leaf7 = d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return 0u;            // OSXSAVE
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo >> 17 & 3) != 3) return 0u;  // the OS saves the tile state (XTILECFG, XTILEDATA)
    // Linux hands out the tile data state on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), for the process
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? leaf7 : 0u;
  }();
  return edx >> feature & 1;
}

bool amx_ready() { return amx_has(25); }
bool amx_bf16_ready() { return amx_has(22); }

namespace {

// The tiles' shapes (palette 1: 8 tiles of up to 16 rows x 64 bytes). The integer kernel: 0 the activations
// (rows x 32 bytes), 1 the leftover rows' (a pass of more than 16 rows whose count is not a multiple of 16; else
// unused), 2 a chunk's weights (8 x 64), 3 and 4 the int32 sums of 0 and 1. The bf16 kernel: 0 a row tile's
// activations (rows x 16 pairs), 1-3 three groups' weights (16 pairs x 16 columns), 4-6 their float32 sums.
constexpr int TILES = 8;
struct Shapes {
  int rows[TILES] = {}, colsb[TILES] = {};
  static Shapes int8(int full, int left) {
    return {{full, left, 8, full, left}, {full ? 32 : 0, left ? 32 : 0, 64, full ? 64 : 0, left ? 64 : 0}};
  }
  static Shapes bf16(int rows) { return {{rows, 16, 16, 16, rows, rows, rows}, {64, 64, 64, 64, 64, 64, 64}}; }
};
constexpr int64_t BF16_TILE_PAIRS = 16, BF16_TILE_BYTES = BF16_TILE_PAIRS * BF16_PAIR_BYTES;

// The instructions, written out (gcc's intrinsics name a tile by a literal and declare no memory they read).
// A unit offers configure, release, and for each kernel its steps: the integer one's weights (tile 2 from 8 rows
// of 64 bytes) and sums (a row tile's: its activations loaded, tdpbsud into zeroed sums, stored 64 bytes a row);
// the bf16 one's zero, step (the activations' tile, then G groups' weights and tdpbf16ps each) and store.
struct AmxUnit {
  struct alignas(64) Config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  };
  static void configure(const Shapes& s) {
    Config c{};
    c.palette = 1;
    for (int t = 0; t < TILES; ++t) c.rows[t] = uint8_t(s.rows[t]), c.colsb[t] = uint16_t(s.colsb[t]);
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
  }
  static void weights(const uint8_t* p) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm2" ::"r"(p), "r"(int64_t(64)) : "memory");
  }
  static void sums(bool left, const int8_t* x, int64_t stride, int32_t* out) {
    if (!left)
      __asm__ volatile(
          "tileloadd (%0,%1,1), %%tmm0\n\t"
          "tilezero %%tmm3\n\t"
          "tdpbsud %%tmm2, %%tmm0, %%tmm3\n\t"
          "tilestored %%tmm3, (%2,%3,1)" ::"r"(x), "r"(stride), "r"(out), "r"(int64_t(64)) : "memory");
    else
      __asm__ volatile(
          "tileloadd (%0,%1,1), %%tmm1\n\t"
          "tilezero %%tmm4\n\t"
          "tdpbsud %%tmm2, %%tmm1, %%tmm4\n\t"
          "tilestored %%tmm4, (%2,%3,1)" ::"r"(x), "r"(stride), "r"(out), "r"(int64_t(64)) : "memory");
  }
  template <int J>
  static void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(4 + J));
  }
  template <int G, int J = 0>
  static void step(const uint32_t* x, int64_t stride, const uint8_t* w) {
    if constexpr (J == 0) __asm__ volatile("tileloadd (%0,%1,1), %%tmm0" ::"r"(x), "r"(stride) : "memory");
    __asm__ volatile(
        "tileloadd (%0,%1,1), %%tmm%c2\n\t"
        "tdpbf16ps %%tmm%c2, %%tmm0, %%tmm%c3" ::"r"(w + J * BF16_TILE_BYTES), "r"(int64_t(64)), "i"(1 + J), "i"(4 + J)
        : "memory");
    if constexpr (J + 1 < G) step<G, J + 1>(x, stride, w);
  }
  template <int J>
  static void store(float* out) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(out), "r"(int64_t(64)), "i"(4 + J) : "memory");
  }
  static void release() { __asm__ volatile("tilerelease" ::: "memory"); }
};

// The same instructions in plain C++, from the Intel SDM's pseudo-code (LDTILECFG, TILELOADD, TILEZERO,
// TDPBSUD, TDPBF16PS, TILESTORED), each tile's rows and bytes from the configuration, and the shape rules under
// which the dot products raise #UD checked: what the kernels ask of the tiles is what the hardware would be asked.
struct AmxModel {
  struct State {
    Shapes s;
    uint8_t t[TILES][16][64];
  };
  static State& state() {
    static thread_local State st;
    return st;
  }
  static void configure(const Shapes& s) {
    for (int t = 0; t < TILES; ++t)
      TORCH_CHECK(s.rows[t] <= 16 && s.colsb[t] <= 64 && s.colsb[t] % 4 == 0, "AMX model: tile ", t, " over palette 1");
    state().s = s;
    std::memset(state().t, 0, sizeof state().t);  // LDTILECFG zeroes every tile
  }
  static void load(int t, const void* p, int64_t stride) {
    State& st = state();
    std::memset(st.t[t], 0, sizeof st.t[t]);  // the bytes past the configured ones read as zero
    for (int r = 0; r < st.s.rows[t]; ++r) std::memcpy(st.t[t][r], static_cast<const uint8_t*>(p) + r * stride, st.s.colsb[t]);
  }
  static void check(int c, int a, int b) {
    const Shapes& s = state().s;
    TORCH_CHECK(s.colsb[a] / 4 == s.rows[b] && s.colsb[c] == s.colsb[b] && s.rows[c] == s.rows[a] && s.rows[c] > 0,
                "AMX model: the dot product's shapes fault (#UD)");
  }
  static void dpbsud(int c, int a, int b) {
    check(c, a, b);
    State& st = state();
    for (int m = 0; m < st.s.rows[c]; ++m)
      for (int k = 0; k < st.s.colsb[a] / 4; ++k)
        for (int n = 0; n < st.s.colsb[c] / 4; ++n) {
          uint32_t acc;  // int32 sums wrap, as the hardware's
          std::memcpy(&acc, st.t[c][m] + 4 * n, 4);
          for (int i = 0; i < 4; ++i)
            acc += uint32_t(int32_t(int8_t(st.t[a][m][4 * k + i])) * int32_t(st.t[b][k][4 * n + i]));
          std::memcpy(st.t[c][m] + 4 * n, &acc, 4);
        }
  }
  // Each pair's element 0 added first, then 1: an FMA rounded to nearest even, input denormals read as zero,
  // a denormal result flushed to zero (MXCSR not consulted).
  static void dpbf16ps(int c, int a, int b) {
    check(c, a, b);
    const auto flush = [](float v) {
      return std::fabs(v) < std::numeric_limits<float>::min() ? std::copysign(0.f, v) : v;
    };
    const auto value = [&](const uint8_t* p) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t u = uint32_t(h) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      return flush(v);
    };
    State& st = state();
    for (int m = 0; m < st.s.rows[c]; ++m)
      for (int k = 0; k < st.s.colsb[a] / 4; ++k)
        for (int n = 0; n < st.s.colsb[c] / 4; ++n) {
          float acc;
          std::memcpy(&acc, st.t[c][m] + 4 * n, 4);
          for (int e = 0; e < 2; ++e)
            acc = flush(std::fma(value(st.t[b][k] + 4 * n + 2 * e), value(st.t[a][m] + 4 * k + 2 * e), acc));
          std::memcpy(st.t[c][m] + 4 * n, &acc, 4);
        }
  }
  static void store(int t, void* p, int64_t stride) {
    const State& st = state();
    for (int r = 0; r < st.s.rows[t]; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, st.t[t][r], st.s.colsb[t]);
  }
  static void weights(const uint8_t* p) { load(2, p, 64); }
  static void sums(bool left, const int8_t* x, int64_t stride, int32_t* out) {
    load(left ? 1 : 0, x, stride);
    std::memset(state().t[left ? 4 : 3], 0, sizeof state().t[0]);
    dpbsud(left ? 4 : 3, left ? 1 : 0, 2);
    store(left ? 4 : 3, out, 64);
  }
  template <int J>
  static void zero() {
    std::memset(state().t[4 + J], 0, sizeof state().t[0]);
  }
  template <int G>
  static void step(const uint32_t* x, int64_t stride, const uint8_t* w) {
    load(0, x, stride);
    for (int j = 0; j < G; ++j) {
      load(1 + j, w + j * BF16_TILE_BYTES, 64);
      dpbf16ps(4 + j, 0, 1 + j);
    }
  }
  template <int J>
  static void store(float* out) {
    store(4 + J, out, 64);
  }
  static void release() {}
};

// A chunk's packed weights as a B tile's 8 rows: row v (< 4) weights 4v .. 4v+3 of every column, row 4 + v
// weights 16 + 4v ..: packed vector v split as the AVX512-VNNI tile splits it (q8_0: the 8 vectors are the rows).
template <WType T>
inline const uint8_t* chunk_rows(const uint8_t* rec, uint8_t* buf) {
  using V = VnniTiles<Zmm, T>;
  const uint8_t* q = rec + packed_quants(T);
  if constexpr (!packed_format(T).nibbles) return q;
  __m512i planes[packed_format(T).planes > 0 ? packed_format(T).planes : 1], lo, hi;
  V::planes_of(q, planes);
  for (int v = 0; v < 4; ++v) {
    V::split(q, planes, v, lo, hi);
    _mm512_store_si512(buf + 64 * v, lo);
    _mm512_store_si512(buf + 64 * (4 + v), hi);
  }
  return buf;
}

// Packed groups [u0, u1) of every row (a.M >= 2), row tiles of up to 16: per chunk, the weights' B tile once,
// each row tile's sums, then each row's epilogue (the sums start from the row's c, as vnni_tiles.h's do).
template <class U, WType T>
void units(const QLinearArgs& a, int64_t u0, int64_t u1) {
  using V = VnniTiles<Zmm, T>;
  const int64_t nb = a.K / QBLOCK, M = a.M;
  const int full = int(M < 16 ? M : 16), left = int(M > 16 ? M % 16 : 0);
  U::configure(Shapes::int8(full, left));
  alignas(64) uint8_t wbuf[8 * 64];
  alignas(64) int32_t sums[16 * 16];
  for (int64_t u = u0; u < u1; ++u)
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
      const int R = int(M - m0 < 16 ? M - m0 : 16);
      __m512 acc[16][1][1], f[16][1][1];  // each row a tile of one for VnniTiles' fold
      for (int r = 0; r < R; ++r) acc[r][0][0] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const PackedChunk<const uint8_t> pc = packed_chunk_at(a.w, T, u, b, a.K), one[1] = {pc};
        if (u + 1 < u1) V::prefetch(a.w + (u + 1) * packed_group_bytes(T, a.K), packed_chunk_offsets(T, b));  // the next group's chunk
        U::weights(chunk_rows<T>(pc.rec, wbuf));
        U::sums(R != full, a.x.q + m0 * a.K + b * QBLOCK, a.K, sums);
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (m0 + r) * nb + b;
          const __m512i is[1][1][1] = {{{_mm512_add_epi32(_mm512_load_si512(sums + 16 * r), _mm512_set1_epi32(a.x.c[xb]))}}};
          V::template fold<1, 1>(acc[r], f[r], one, u, is, a.x, m0 + r, nb, b);
        }
      }
      for (int r = 0; r < R; ++r) {
        const int64_t n = u * QGROUP;
        __m512 y = acc[r][0][0];
        if (a.bias) y = _mm512_add_ps(y, _mm512_loadu_ps(a.bias + n));
        _mm512_storeu_ps(a.y + (m0 + r) * a.ldy + n, y);
      }
    }
  U::release();
}

template <class U>
void dispatch(const QLinearArgs& a, int64_t g0, int64_t g1) {
  if (a.M < 2) return qlinear_avx512vnni(a, g0, g1);
  switch (a.wtype) {
    case WType::q8_0: return units<U, WType::q8_0>(a, g0, g1);
    case WType::q4_0: return units<U, WType::q4_0>(a, g0, g1);
    case WType::q4_1: return units<U, WType::q4_1>(a, g0, g1);
    case WType::q5_0: return units<U, WType::q5_0>(a, g0, g1);
    case WType::q5_1: return units<U, WType::q5_1>(a, g0, g1);
    case WType::q4_k: return units<U, WType::q4_k>(a, g0, g1);
    case WType::q5_k: return units<U, WType::q5_k>(a, g0, g1);
    default: return qlinear_avx512vnni(a, g0, g1);  // q6_k: two sums a chunk
  }
}

// x's rows as the A tiles read them: each pair's elements swapped, every row padded to whole tiles with pairs
// (-0, -0) whose products (-0 times the weights' zero padding) leave every sum's bits as they are.
inline void swapped_rows(const BLinearArgs& a, int64_t ld, std::vector<uint32_t>& out) {
  const int64_t KP = a.K / 2;
  out.assign(size_t(a.M * ld), 0x80008000u);
  for (int64_t m = 0; m < a.M; ++m) {
    const uint32_t* x = reinterpret_cast<const uint32_t*>(a.x + m * a.K);
    uint32_t* o = out.data() + m * ld;
    int64_t p = 0;
    for (; p + 16 <= KP; p += 16) _mm512_storeu_si512(o + p, _mm512_rol_epi32(_mm512_loadu_si512(x + p), 16));
    const __mmask16 live = __mmask16((1u << (KP - p)) - 1);
    _mm512_mask_storeu_epi32(o + p, live, _mm512_rol_epi32(_mm512_maskz_loadu_epi32(live, x + p), 16));
  }
}

// G groups' weights from pair p0 on as G B tiles, each pair's elements swapped (zeros past the matrix's pairs).
template <int G>
inline void swapped_weights(const BLinearArgs& a, int64_t g, int64_t p0, uint8_t* out) {
  const int64_t KP = a.K / 2, n = KP - p0 < BF16_TILE_PAIRS ? KP - p0 : BF16_TILE_PAIRS;
  for (int j = 0; j < G; ++j) {
    const uint8_t* w = a.w + ((g + j) * KP + p0) * BF16_PAIR_BYTES;
    uint8_t* o = out + j * BF16_TILE_BYTES;
    for (int64_t i = 0; i < n; ++i)
      _mm512_store_si512(o + i * 64, _mm512_rol_epi32(_mm512_loadu_si512(w + i * BF16_PAIR_BYTES), 16));
    for (int64_t i = n; i < BF16_TILE_PAIRS; ++i) _mm512_store_si512(o + i * 64, _mm512_setzero_si512());
  }
}

// Groups [g, g + G) of a row tile (rows m0 .. m0 + R - 1): the sums over every pair's tile, then y (+ bias).
template <class U, int G>
void bf16_groups(const BLinearArgs& a, const uint32_t* xs, int64_t ld, int64_t m0, int R, int64_t g) {
  alignas(64) uint8_t wbuf[G * BF16_TILE_BYTES];
  alignas(64) float sums[G][16 * 16];
  U::template zero<0>();
  if constexpr (G > 1) U::template zero<1>();
  if constexpr (G > 2) U::template zero<2>();
  for (int64_t p0 = 0; p0 < ld; p0 += BF16_TILE_PAIRS) {
    swapped_weights<G>(a, g, p0, wbuf);
    U::template step<G>(xs + m0 * ld + p0, ld * 4, wbuf);
  }
  U::template store<0>(sums[0]);
  if constexpr (G > 1) U::template store<1>(sums[1]);
  if constexpr (G > 2) U::template store<2>(sums[2]);
  for (int j = 0; j < G; ++j) {
    const int64_t n = (g + j) * QGROUP;
    for (int r = 0; r < R; ++r) {
      __m512 y = _mm512_load_ps(sums[j] + 16 * r);
      if (a.bias) y = _mm512_add_ps(y, _mm512_loadu_ps(a.bias + n));
      _mm512_storeu_ps(a.y + (m0 + r) * a.ldy + n, y);
    }
  }
}

// Column groups [g0, g1) of every row (a.M >= 2): row tiles of up to 16, three groups at a time.
template <class U>
void bf16_units(const BLinearArgs& a, int64_t g0, int64_t g1) {
  if (a.M < 2) return bf16linear_avx512bf16(a, g0, g1);
  static thread_local std::vector<uint32_t> xs;
  const int64_t ld = (a.K / 2 + BF16_TILE_PAIRS - 1) / BF16_TILE_PAIRS * BF16_TILE_PAIRS;  // pairs a row
  swapped_rows(a, ld, xs);
  int configured = 0;
  for (int64_t m0 = 0; m0 < a.M; m0 += 16) {
    const int R = int(a.M - m0 < 16 ? a.M - m0 : 16);
    if (R != configured) U::configure(Shapes::bf16(configured = R));
    int64_t g = g0;
    for (; g + 3 <= g1; g += 3) bf16_groups<U, 3>(a, xs.data(), ld, m0, R, g);
    if (g1 - g == 2) bf16_groups<U, 2>(a, xs.data(), ld, m0, R, g);
    if (g1 - g == 1) bf16_groups<U, 1>(a, xs.data(), ld, m0, R, g);
  }
  U::release();
}

}  // namespace

void bf16linear_amx(const BLinearArgs& a, int64_t g0, int64_t g1) { bf16_units<AmxUnit>(a, g0, g1); }
void bf16linear_amx_model(const BLinearArgs& a, int64_t g0, int64_t g1) { bf16_units<AmxModel>(a, g0, g1); }
void qlinear_amx(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch<AmxUnit>(a, g0, g1); }
void qlinear_amx_model(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch<AmxModel>(a, g0, g1); }

}  // namespace peagle
