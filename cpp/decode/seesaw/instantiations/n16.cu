// The seesaw kernel with PV width 16 (query rows per CTA that reach PV) in the one-term row
// layout: built only without SNAPMLA_SEESAW_SPREAD16 (decode.h), under which the one-term query
// at N = 16 runs the two-term instantiation's layout (n16_two_term.cu).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
#if !SNAPMLA_SEESAW_SPREAD16
template cudaError_t run<16>(const DecodeParams&, const TensorMaps&, cudaStream_t);
#endif
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
