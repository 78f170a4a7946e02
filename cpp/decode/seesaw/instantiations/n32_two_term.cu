// The seesaw kernel with PV width 32 and the two-term query (config.q_precision FP8X2).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
template cudaError_t run<32, true>(const DecodeParams&, const TensorMaps&, cudaStream_t);
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
