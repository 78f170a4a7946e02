// The seesaw kernel with PV width 64 (query rows per CTA that reach PV).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
template cudaError_t run<64>(const DecodeParams&, const TensorMaps&, cudaStream_t);
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
