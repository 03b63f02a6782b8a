// The Python extension jax_tcgemm._tcgemm: FFI handler capsules, the config table, and the
// derived rules of the host planner (split, packing, workspace), so that Python uses the one
// C++ copy of each instead of computing its own.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "host/gemm_config.h"
#include "host/gemm_dispatch.h"
#include "host/gemm_params.h"
#include "xla/gemm_ffi.h"

namespace nb = nanobind;

namespace {

template <int CFG>
int SmemBytes() {  // dynamic shared memory of an sm80 row's kernel (sm90 rows: 0, one per SM)
  if constexpr (tcgemm::kConfigs[CFG].kind == tcgemm::Kind::kSm80)
    return tcgemm::ConfigTraits<CFG>::kSmemBytes;
  else
    return 0;
}
template <int... CFGs>
int SmemBytesOf(int config, std::integer_sequence<int, CFGs...>) {
  static const int table[] = {SmemBytes<CFGs>()...};
  return table[config];
}

int ConfigIndex(const std::string& name) {
  const int i = tcgemm::FindConfig(name);
  if (i < 0) throw nb::value_error(("unknown config " + name).c_str());
  return i;
}

tcgemm::GemmProblem Problem(int64_t m, int64_t n, int64_t k, int64_t batch, bool a_shared,
                            bool b_shared, bool transpose_a, bool transpose_b,
                            const std::string& config, int split_k, bool pack, int operand_bytes) {
  tcgemm::GemmProblem pr{};
  // (the operand type matters to these rules only through its size: the k tile of sm90 rows)
  pr.in_type = operand_bytes == 4 ? tcgemm::DType::kF32
               : operand_bytes == 1 ? tcgemm::DType::kS8 : tcgemm::DType::kF16;
  pr.b_type = pr.in_type;
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
  pr.config = ConfigIndex(config);
  return pr;
}

}  // namespace

NB_MODULE(_tcgemm, m) {
  m.doc() = "jax_tcgemm CUDA kernels (XLA FFI handlers) and the host planner's rules";
  m.def("registrations", []() {
    nb::dict d;
    d["tcgemm"] = nb::capsule(reinterpret_cast<void*>(tcgemm::TcgemmHandler));
    d["tcgemm_dact"] = nb::capsule(reinterpret_cast<void*>(tcgemm::TcgemmDactHandler));
    d["tcgemm_ragged"] = nb::capsule(reinterpret_cast<void*>(tcgemm::TcgemmRaggedHandler));
    d["tcgemm_split"] = nb::capsule(reinterpret_cast<void*>(tcgemm::TcgemmSplitHandler));
    return d;
  }, "FFI target name -> handler capsule, for jax.ffi.register_ffi_target(platform='CUDA').");
  m.def("config_names", []() {
    const auto& names = tcgemm::ConfigNames();
    return std::vector<std::string>(names.begin(), names.end());
  }, "Names of the compiled kernel configs, in table order.");
  m.def("config_table", []() {
    nb::list rows;
    for (int i = 0; i < tcgemm::kNumConfigs; ++i) {
      const tcgemm::GemmConfig& c = tcgemm::kConfigs[i];
      const bool sm90 = c.kind == tcgemm::Kind::kSm90;
      nb::dict r;
      r["name"] = tcgemm::ConfigNames()[i];
      const bool narrow = c.kind == tcgemm::Kind::kNarrow;
      r["kind"] = sm90 ? "sm90" : narrow ? "narrow" : "sm80";
      r["bm"] = c.bm; r["bn"] = c.bn; r["bk"] = c.bk; r["stages"] = c.stages;
      r["warps_m"] = c.warps_m; r["warps_n"] = c.warps_n; r["warps_k"] = c.warps_k;
      r["consumers"] = c.consumers;
      r["pingpong"] = c.pingpong;
      r["fp8_only"] = c.fp8_only;
      r["threads"] = sm90 ? 128 * (c.consumers + 1) : 32 * c.warps_m * c.warps_n * c.warps_k;
      r["smem_bytes"] =
          SmemBytesOf(i, std::make_integer_sequence<int, tcgemm::kNumConfigs>{});
      r["fallback"] = tcgemm::ConfigNames()[tcgemm::Sm80Fallback(i)];
      r["element_loads"] = tcgemm::HasElementLoads(i);
      r["ragged"] = tcgemm::HasRaggedKernels(i);
      r["int8"] = tcgemm::HasByteKernels(i, false);
      r["fp8"] = tcgemm::HasByteKernels(i, true);
      r["f32"] = tcgemm::HasTf32Kernels(i);
      r["staged_scales"] = tcgemm::Sm90StagesScales(i);
      rows.append(r);
    }
    return rows;
  }, "The config table (ffi/host/gemm_config.inc) with each row's derived name, threads, "
     "shared memory (sm80 rows), sm80 fallback, element-wise loads, grouped (ragged) "
     "kernels, 8-bit (int8, fp8) kernels and float32 (TF32) kernels, in table order.");
  m.def("max_split_k", []() { return tcgemm::kMaxSplitK; },
        "Most K slices of a split-K product that the handler accepts.");
  m.def("max_cluster_split", []() { return tcgemm::kMaxClusterSplit; },
        "Most K slices reduced inside one thread block cluster (sm_90+), with no workspace pass.");
  m.def("num_activations", []() { return tcgemm::kNumActivations; },
        "Number of epilogue activations (Activation in ffi/host/gemm_params.h).");
  m.def("needs_pack", [](int64_t cols) { return tcgemm::NeedsPack(cols); },
        "Whether a packing product copies an operand whose rows have `cols` elements.");
  m.def("packed_ld", [](int64_t cols) { return tcgemm::PackedLd(cols); },
        "Row length of the packed copy of rows of `cols` elements.");
  m.def("effective_split",
        [](const std::string& config, int64_t k, int split_k, int operand_bytes) {
          return tcgemm::EffectiveSplitK(
              Problem(1, 1, k, 1, true, true, false, false, config, split_k, false, operand_bytes));
        },
        nb::arg("config"), nb::arg("k"), nb::arg("split_k"), nb::arg("operand_bytes") = 2,
        "K slices that run for `split_k` requested ones (no slice left empty) of operands of "
        "`operand_bytes` bytes.");
  m.def("workspace_floats",
        [](int64_t m, int64_t n, int64_t k, int64_t batch, bool a_shared, bool b_shared,
           bool transpose_a, bool transpose_b, const std::string& config, int split_k,
           bool pack, int operand_bytes, int64_t tail_rows, int tail_split) {
          tcgemm::GemmProblem pr = Problem(m, n, k, batch, a_shared, b_shared, transpose_a,
                                           transpose_b, config, split_k, pack, operand_bytes);
          pr.tail_rows = tail_rows;
          pr.tail_split = tail_split;
          return tcgemm::PlanWorkspace(pr).total();
        },
        nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("batch"), nb::arg("a_shared"),
        nb::arg("b_shared"), nb::arg("transpose_a"), nb::arg("transpose_b"), nb::arg("config"),
        nb::arg("split_k"), nb::arg("pack"), nb::arg("operand_bytes") = 2,
        nb::arg("tail_rows") = 0, nb::arg("tail_split") = 1,
        "Floats of workspace the handler needs (split-K partials, or a tail split's tail "
        "partials; packed operand copies) for operands of `operand_bytes` bytes.");
}
