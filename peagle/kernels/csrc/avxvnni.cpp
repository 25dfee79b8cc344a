// AVX-VNNI (Intel since Alder Lake, Zen 5; the VEX form of vpdpbusd, for CPUs without AVX-512): the
// integer path (kernels.h) on packed GGUF blocks, half a packed group's columns (8) in the lanes of a
// 256-bit vector. The same tile as AVX512-VNNI (vnni_tiles.h), in 16 registers (ymm.h). Chosen at run time.
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include <immintrin.h>

#include "vnni_tiles.h"
#include "ymm.h"

namespace peagle {
namespace {

struct Ymm : YmmBase {
  static ivec dpbusd(ivec acc, ivec w, ivec x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
};

template <WType T>
using VnniAvx = VnniTiles<Ymm, T>;

}  // namespace

void qlinear_avxvnni(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch_packed<VnniAvx>(a, 2 * g0, 2 * g1); }

}  // namespace peagle
