// The Python extension jax_tcgemm._tcgemm: FFI handler capsules and the config table.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "gemm_config.h"
#include "gemm_dispatch.h"
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
  m.def("workspace_floats",
        [](int64_t m, int64_t n, int64_t k, int64_t batch, bool a_shared, bool b_shared,
           bool transpose_a, bool transpose_b, const std::string& config, int split_k,
           bool pack) {
          tcgemm::GemmProblem pr{};
          pr.params.m = m;
          pr.params.n = n;
          pr.params.k = k;
          pr.params.batch = batch;
          pr.params.stride_a = a_shared ? 0 : m * k;
          pr.params.stride_b = b_shared ? 0 : k * n;
          pr.params.split_k = split_k;
          pr.transpose_a = transpose_a;
          pr.transpose_b = transpose_b;
          pr.pack = pack;
          pr.config = tcgemm::FindConfig(config);
          if (pr.config < 0) throw nb::value_error(("unknown config " + config).c_str());
          return tcgemm::PlanWorkspace(pr).total();
        },
        "Floats of workspace the handler needs (split-K partials, packed operand copies): what "
        "configs.workspace_floats must compute.");
  m.def("max_cluster_split", []() { return tcgemm::kMaxClusterSplit; },
        "Most K slices reduced inside one thread block cluster (sm_90+), with no workspace pass.");
}
