// The seesaw kernel with PV width 64 and the PV accumulating into O^T itself (kPvDirect).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
template cudaError_t run<64, false, true>(const DecodeParams&, const TensorMaps&, cudaStream_t);
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
