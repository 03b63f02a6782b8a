// The Python extension jax_tcgemm._tcgemm: FFI handler capsules and the config table.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "gemm_config.h"
#include "gemm_ffi.h"
#include "gemm_params.h"

namespace nb = nanobind;

NB_MODULE(_tcgemm, m) {
  m.doc() = "jax_tcgemm CUDA kernels (XLA FFI handlers)";
  m.def("registrations", []() {
    nb::dict d;
    d["tcgemm"] = nb::capsule(reinterpret_cast<void*>(tcgemm::TcgemmHandler));
    return d;
  }, "FFI target name -> handler capsule, for jax.ffi.register_ffi_target(platform='CUDA').");
  m.def("config_names", []() {
    const auto& names = tcgemm::ConfigNames();
    return std::vector<std::string>(names.begin(), names.end());
  }, "Names of the compiled kernel configs, in table order.");
  m.def("max_split_k", []() { return tcgemm::kMaxSplitK; },
        "Most K slices of a split-K product that the handler accepts.");
  m.def("max_cluster_split", []() { return tcgemm::kMaxClusterSplit; },
        "Most K slices reduced inside one thread block cluster (sm_90+), with no workspace pass.");
}
