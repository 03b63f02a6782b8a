#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over the GEMM kernels, on the GPU
# machine. Builds the standalone self-test (tools/kernel_selftest.cu, with -lineinfo) and runs
# its `--sanitize` case list (one small problem per config x layout x dtype x aligned/unaligned
# loader; output types, shared operands and split-K rotating) under each tool. Prints each
# tool's summary; exits 0 if every tool reports 0 errors, 1 on any error (or a failed build /
# self-test), 2 if compute-sanitizer is missing or cannot attach to the GPU.
#   usage: tools/sanitize.sh                      logs under $OUT/sanitize (default gpu_out/)
#   env:   SANITIZE_TOOLS="memcheck racecheck"    a subset of the tools (one per call if the
#                                                 whole run nears a time limit; objects newer
#                                                 than ffi/ and the self-test are reused)
#          COMPUTE_SANITIZER=/path/to/compute-sanitizer, TCGEMM_ARCH=sm_90, SANITIZE_TIMEOUT=900
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}
LOGS="$OUT/sanitize"
BUILD=${SANITIZE_BUILD:-$REPO/build/sanitize}  # git-ignored: kept between calls on a warm machine
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}

# --- compute-sanitizer: $COMPUTE_SANITIZER, PATH, next to nvcc, the usual toolkit folders, and
# the nvidia-cuda-sanitizer-api wheel.
find_sanitizer() {
  local c nvcc_dir=""
  if [ -n "${COMPUTE_SANITIZER:-}" ]; then echo "$COMPUTE_SANITIZER"; return; fi
  if c=$(command -v compute-sanitizer 2>/dev/null); then echo "$c"; return; fi
  if nvcc_path=$(command -v nvcc 2>/dev/null); then nvcc_dir=$(dirname "$(readlink -f "$nvcc_path")"); fi
  for c in ${nvcc_dir:+"$nvcc_dir/compute-sanitizer" "$nvcc_dir/../compute-sanitizer/compute-sanitizer"} \
           ${CUDA_HOME:+"$CUDA_HOME/bin/compute-sanitizer"} ${CUDA_PATH:+"$CUDA_PATH/bin/compute-sanitizer"} \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           /usr/local/cuda-13.0/bin/compute-sanitizer /usr/local/cuda-13.0/compute-sanitizer/compute-sanitizer \
           $(ls -d /usr/local/cuda-*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | sort -rV); do
    if [ -x "$c" ]; then echo "$c"; return; fi
  done
  python3 - 2>/dev/null <<'PY'
import glob, os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for c in sorted(glob.glob(d + "/nvidia/**/compute-sanitizer", recursive=True)):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            print(c)
            sys.exit(0)
sys.exit(1)
PY
}
CS=$(find_sanitizer) || CS=""
if [ -z "$CS" ] || [ ! -x "$CS" ]; then
  echo "sanitize.sh: compute-sanitizer not found (looked at \$COMPUTE_SANITIZER, PATH, next to nvcc," \
       "\$CUDA_HOME/bin, /usr/local/cuda*/bin, /opt/nvidia, and the nvidia wheels). It ships with" \
       "the CUDA toolkit; point COMPUTE_SANITIZER at it." >&2
  exit 2
fi
mkdir -p "$LOGS" "$BUILD"
echo "compute-sanitizer: $CS ($("$CS" --version 2>/dev/null | grep -m1 -i version))"

# --- build the self-test (as tools/gpu_check.sh does, plus -lineinfo for file:line reports)
if [ -z "${TCGEMM_ARCH:-}" ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  TCGEMM_ARCH=sm_${cap:-90}
fi
F=(-std=c++17 -O3 -lineinfo "-arch=$TCGEMM_ARCH" "-I$REPO/ffi")
echo "== build ($TCGEMM_ARCH)"
srcs=("$REPO"/ffi/kernels/*/*.cu "$REPO/ffi/host/gemm_dispatch.cc" "$REPO/tools/kernel_selftest.cu")
[ "$(cat "$BUILD/arch" 2>/dev/null)" = "$TCGEMM_ARCH" ] || rm -f "$BUILD"/*.o
echo "$TCGEMM_ARCH" >"$BUILD/arch"
for o in "$BUILD"/*.o; do  # objects of sources that no longer exist
  [ -e "$o" ] || continue
  keep=0; for src in "${srcs[@]}"; do [ "$o" = "$BUILD/$(basename "$src").o" ] && keep=1; done
  [ $keep = 1 ] || rm -f "$o"
done
pids=()
for src in "${srcs[@]}"; do
  obj="$BUILD/$(basename "$src").o"
  # rebuilt when missing or older than the source or anything under ffi/ (headers)
  if [ -e "$obj" ] && [ -z "$(find "$REPO/ffi" "$src" -newer "$obj" -print -quit)" ]; then continue; fi
  flags=("${F[@]}")  # the wgmma kernels exist only for sm_90a (elsewhere never launched)
  if [ "$(basename "$src")" = kernels_sm90.cu ] && [ "$TCGEMM_ARCH" = sm_90 ]; then
    flags=(-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a "-I$REPO/ffi")
  fi
  (nvcc "${flags[@]}" -x cu -c "$src" -o "$obj" >"$BUILD/$(basename "$src").log" 2>&1 || { rm -f "$obj"; exit 1; }) &
  pids+=($!)
done
build_ok=1
for p in "${pids[@]}"; do wait "$p" || build_ok=0; done
echo "compiled ${#pids[@]} of ${#srcs[@]} objects"
if [ $build_ok = 1 ]; then
  nvcc "-arch=$TCGEMM_ARCH" "$BUILD"/*.o -o "$BUILD/selftest" >"$BUILD/link.log" 2>&1 || build_ok=0
fi
if [ $build_ok = 0 ]; then
  echo "sanitize.sh: build failed:"; tail -n 30 "$BUILD"/*.log; exit 1
fi

# --- the case list without a sanitizer first: it must pass on its own
echo "== self-test --sanitize (no tool)"
"$BUILD/selftest" --sanitize >"$LOGS/native.log" 2>&1
rc=$?
tail -n 3 "$LOGS/native.log"
[ $rc = 0 ] || { echo "sanitize.sh: the self-test fails without a sanitizer (exit $rc)"; exit 1; }

# --- each tool
status=0
for tool in $TOOLS; do
  case $tool in
    memcheck)  extra=(--leak-check full --padding 256) ;;
    racecheck) extra=(--racecheck-report all) ;;
    *)         extra=() ;;
  esac
  echo "== $tool"
  t0=$(date +%s)
  timeout "${SANITIZE_TIMEOUT:-900}" "$CS" --tool "$tool" --error-exitcode 86 --print-limit 50 \
    "${extra[@]}" "$BUILD/selftest" --sanitize >"$LOGS/$tool.log" 2>&1
  rc=$?
  summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$LOGS/$tool.log")
  echo "${summary:-no summary line}"
  echo "$tool: exit $rc, $(( $(date +%s) - t0 )) s, log $LOGS/$tool.log"
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+" "$LOGS/$tool.log" | grep -oE "[0-9]+$" | tail -1)
  race_errors=$(grep -oE "RACECHECK SUMMARY:.*\([0-9]+ error" "$LOGS/$tool.log" | grep -oE "[0-9]+ error" | grep -oE "[0-9]+" | tail -1)
  errors=${errors:-$race_errors}
  if grep -qiE "device not supported|unable to (create|attach)|target application .*not supported|error 999" "$LOGS/$tool.log"; then
    echo "sanitize.sh: $tool could not run on this GPU machine (compute-sanitizer refuses it, as on" \
         "gVisor machines): no verdict. Run on a machine where it attaches (Firecracker)."
    grep -m3 -iE "not supported|unable|error 999" "$LOGS/$tool.log"
    [ $status = 1 ] || status=2
  elif [ $rc != 0 ] || [ -z "$errors" ] || [ "$errors" != 0 ] || [ "${race_errors:-0}" != 0 ]; then
    [ $rc = 124 ] && echo "sanitize.sh: $tool timed out after ${SANITIZE_TIMEOUT:-900} s"
    echo "sanitize.sh: $tool FAILED (exit $rc, errors ${errors:-?}); first reports:"
    grep -m 40 -E "^========= " "$LOGS/$tool.log" | head -40
    grep -E "FAIL|selftest" "$LOGS/$tool.log" | head -5
    status=1
  fi
done
[ $status = 0 ] && echo "sanitize.sh: all tools clean ($TOOLS)"
exit $status
