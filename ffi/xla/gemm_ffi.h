// The XLA FFI handler symbols exported to Python (module.cc).
#pragma once
#include "xla/ffi/api/api.h"

namespace tcgemm {
// Target "tcgemm" (platform CUDA): d = epilogue(op(a) · op(b)), batched.
XLA_FFI_DECLARE_HANDLER_SYMBOL(TcgemmHandler);
// Target "tcgemm_dact" (platform CUDA): the epilogue's backward pass (g = ct * act'(pre), the
// bias gradient), one pass over the cotangent.
XLA_FFI_DECLARE_HANDLER_SYMBOL(TcgemmDactHandler);
// Target "tcgemm_ragged" (platform CUDA; ragged_ffi.cc): lax.ragged_dot's grouped products.
XLA_FFI_DECLARE_HANDLER_SYMBOL(TcgemmRaggedHandler);
// Target "tcgemm_split" (platform CUDA; split_ffi.cc): the parts of a float32 operand of a
// multi-pass float32 product, laid out along K (jax_tcgemm/f32.layout).
XLA_FFI_DECLARE_HANDLER_SYMBOL(TcgemmSplitHandler);
}  // namespace tcgemm
