// The seesaw kernel with PV width 32 (query rows per CTA that reach PV) in the one-term row
// layout: built only without SNAPMLA_SEESAW_SPREAD32 (decode.h), under which the one-term query
// at N = 32 runs the two-term instantiation's layout (n32_two_term.cu).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
#if !SNAPMLA_SEESAW_SPREAD32
template cudaError_t run<32>(const DecodeParams&, const TensorMaps&, cudaStream_t);
#endif
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
