// AVX512-VNNI (Intel Xeon since Cascade Lake, Zen 4/5): the integer path (kernels.h) on packed GGUF
// blocks, a packed group's 16 columns in the lanes of a vector, vpdpbusd (uint8 weights x int8
// activations, four products a lane into int32). Chosen at run time; its own file so that no other path
// is compiled for VNNI.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#include <immintrin.h>

#include "vnni_tiles.h"
#include "zmm.h"

namespace peagle {
namespace {

template <WType T>
using Vnni512 = VnniTiles<Zmm, T>;

}  // namespace

void qlinear_avx512vnni(const QLinearArgs& a, int64_t g0, int64_t g1) { dispatch_packed<Vnni512>(a, g0, g1); }

}  // namespace peagle
