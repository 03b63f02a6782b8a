// The XLA FFI handler symbols exported to Python (module.cc).
#pragma once
#include "xla/ffi/api/api.h"

namespace tcgemm {
// Target "tcgemm" (platform CUDA): c = op(a) · op(b), batched.
XLA_FFI_DECLARE_HANDLER_SYMBOL(TcgemmHandler);
}  // namespace tcgemm
