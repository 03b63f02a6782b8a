// Hopper kernels for bfloat16 operands (every sm90 config x layout), in a translation unit of
// their own (kernels_sm90_16bit.cuh); compiled for sm_90a only.
#include "kernels/sm90/kernels_sm90_16bit.cuh"

namespace tcgemm {
template Sm90Entry Sm90Entry16<__nv_bfloat16>(int config, int layout);
}  // namespace tcgemm
