#include "decode/sm90/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
template cudaError_t run<KernelTraits<64, true>>(const DecodeParams&, const TensorMaps&,
                                                 cudaStream_t);
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
