// AMX-INT8 (Intel Xeon since Sapphire Rapids): the integer path's products (kernels.h) as tile dot products.
// A packed vector (16 columns x 4 weights, kernels.h's layout) is one 64-byte row of a B tile, so a chunk of
// 32 weights is a B tile of 8 rows; the rows' 8-bit activations of that chunk are an A tile (up to 16 rows x 32
// bytes); tdpbsud (int8 x uint8 into int32) gives every row's integer sum of the chunk at once, exact; the float
// epilogue is AVX512-VNNI's (vnni_tiles.h), in its order: a row's bits are the reference's, whatever the pass.
// Passes of one row stay on AVX512-VNNI (a row reads each weight once either way), and so does q6_k (two sums a
// chunk). The tile unit is a template parameter: AmxUnit runs the instructions; AmxModel is a plain C++ model of
// them (Intel's pseudo-code, and the shape rules the hardware faults on, checked), so the kernel around them is
// tested bit for bit on any AVX512-VNNI CPU (tests/test_int8.py); on an AMX CPU `python -m peagle.kernels` also
// probes the real one against the reference and times it before it is chosen (peagle/kernels/__init__.py).
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cpuid.h>
#include <cstring>

#include "vnni_tiles.h"
#include "zmm.h"

namespace peagle {

bool amx_ready() {
  static const bool ready = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1)) return false;  // AMX-TILE, -INT8
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return false;                             // OSXSAVE
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo >> 17 & 3) != 3) return false;  // the OS saves the tile state (XTILECFG, XTILEDATA)
    // Linux hands out the tile data state on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), for the process
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ready;
}

namespace {

// The tiles a call uses: 0 the activations (rows x 32 bytes), 1 the leftover rows' (a pass of more than 16 rows
// whose count is not a multiple of 16; else unused), 2 a chunk's weights (8 x 64), 3 and 4 the int32 sums of 0 and 1.
// A unit offers configure, weights (tile 2 from 8 rows of 64 bytes), sums (a row tile's: its activations loaded,
// tdpbsud into zeroed sums, stored 64 bytes a row) and release.
constexpr int TILES = 5;
struct Shapes {
  int rows[TILES], colsb[TILES];
  Shapes(int full, int left)
      : rows{full, left, 8, full, left}, colsb{full ? 32 : 0, left ? 32 : 0, 64, full ? 64 : 0, left ? 64 : 0} {}
};

// The instructions (palette 1: 8 tiles of up to 16 rows x 64 bytes), written out (gcc's intrinsics name a tile
// by a literal and declare no memory they read).
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
  static void release() { __asm__ volatile("tilerelease" ::: "memory"); }
};

// The same instructions in plain C++, from the Intel SDM's pseudo-code (LDTILECFG, TILELOADD, TILEZERO,
// TDPBSUD, TILESTORED), each tile's rows and bytes from the configuration, and the shape rules under which
// TDPBSUD raises #UD checked: what the kernel asks of the tiles is what the hardware would be asked.
struct AmxModel {
  struct State {
    Shapes s{0, 0};
    uint8_t t[8][16][64];
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
  static void dpbsud(int c, int a, int b) {
    State& st = state();
    const Shapes& s = st.s;
    TORCH_CHECK(s.colsb[a] / 4 == s.rows[b] && s.colsb[c] == s.colsb[b] && s.rows[c] == s.rows[a] && s.rows[c] > 0,
                "AMX model: tdpbsud's shapes fault (#UD)");
    for (int m = 0; m < s.rows[c]; ++m)
      for (int k = 0; k < s.colsb[a] / 4; ++k)
        for (int n = 0; n < s.colsb[c] / 4; ++n) {
          uint32_t acc;  // int32 sums wrap, as the hardware's
          std::memcpy(&acc, st.t[c][m] + 4 * n, 4);
          for (int i = 0; i < 4; ++i)
            acc += uint32_t(int32_t(int8_t(st.t[a][m][4 * k + i])) * int32_t(st.t[b][k][4 * n + i]));
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
  constexpr int64_t PB = packed_chunk(T);
  const int64_t nb = a.K / QBLOCK, M = a.M;
  const int full = int(M < 16 ? M : 16), left = int(M > 16 ? M % 16 : 0);
  U::configure(Shapes(full, left));
  alignas(64) uint8_t wbuf[8 * 64];
  alignas(64) int32_t sums[16 * 16];
  for (int64_t u = u0; u < u1; ++u)
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
      const int R = int(M - m0 < 16 ? M - m0 : 16);
      __m512 acc[16];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = a.w + (u * nb + b) * PB;
        for (int64_t l = 0; l < PB; l += 64) __builtin_prefetch(rec + nb * PB + l, 0, 3);  // the next group's chunk
        U::weights(chunk_rows<T>(rec, wbuf));
        U::sums(R != full, a.x.q + m0 * a.K + b * QBLOCK, a.K, sums);
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (m0 + r) * nb + b;
          const __m512i is = _mm512_add_epi32(_mm512_load_si512(sums + 16 * r), _mm512_set1_epi32(a.x.c[xb]));
          acc[r] = VnniTiles<Zmm, T>::epilogue(acc[r], rec, &is, a.x.d[xb], a.x.sd[xb]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const int64_t n = u * QGROUP;
        __m512 y = acc[r];
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

}  // namespace

void qlinear_amx(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch<AmxUnit>(a, g0, g1); }
void qlinear_amx_model(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch<AmxModel>(a, g0, g1); }

}  // namespace peagle
