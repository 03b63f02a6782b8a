#!/usr/bin/env bash
# The standalone kernel self-test and compute-sanitizer, on the GPU machine, in one call:
#   1. builds tools/kernel_selftest.cu + tools/selftest_epilogue.cu with every kernel TU
#      (ffi/kernels/*/*.cu, ffi/host/gemm_dispatch.cc; -lineinfo), in parallel;
#   2. runs the full self-test natively (plain, epilogue, dact and coverage checks; timings);
#   3. runs `selftest --quick` natively (it must pass on its own), then under each tool
#      (default memcheck and racecheck): every kernel family (sm80 and sm90 configs, cluster
#      pull / push split-K, workspace split-K + reduction, pack, dact) x every epilogue kind,
#      and grouped (ragged) products on both families (tools/selftest_ragged.cu);
#   4. prints a summary: each step's `N passed, M failed`, each tool's error count, times.
# Exit 0 if everything passed with 0 sanitizer errors, 1 on any failure (build, self-test, a
# tool's errors), 2 if compute-sanitizer is missing or cannot attach to the GPU.
#   usage: tools/sanitize.sh                    logs under $OUT/sanitize (default gpu_out/)
#   env:   SANITIZE_TOOLS="memcheck racecheck"  tools to run ("" none; also initcheck,
#                                               synccheck). Objects newer than ffi/ and the
#                                               self-test are reused, so a run that nears a
#                                               call's time limit can be split, e.g.
#                                               SANITIZE_TOOLS=racecheck SANITIZE_FULL=0
#          SANITIZE_FULL=0                      skip step 2 (SANITIZE_FULL_ARGS: its mode,
#                                               default none: checks + timings; --checks)
#          SANITIZE_DEADLINE=570                end every step by this many seconds after the
#                                               start (timeouts shortened, later steps skipped),
#                                               so that the summary prints inside a call limit
#          SANITIZE_ARGS=--quick                the self-test mode the tools run
#          SELFTEST_CONFIGS=<substring>         only those configs (the self-test's filter)
#          COMPUTE_SANITIZER=path, TCGEMM_ARCH=sm_90, SANITIZE_TIMEOUT=900 (per tool, s),
#          JOBS=$(nproc) parallel nvcc jobs, SPLIT_COMPILE=4 threads per nvcc,
#          SANITIZE_BUILD=build/sanitize
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}
LOGS="$OUT/sanitize"
BUILD=${SANITIZE_BUILD:-$REPO/build/sanitize}  # git-ignored: kept between calls on a warm machine
TOOLS=${SANITIZE_TOOLS-memcheck racecheck}
ARGS=${SANITIZE_ARGS:---quick}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 8)}
mkdir -p "$LOGS" "$BUILD"
summary=()
note() { summary+=("$1"); echo "$1"; }
DEADLINE=${SANITIZE_DEADLINE:-0}
# step_timeout S: S seconds, or less to end 15 s before the deadline (<= 0: no time left)
step_timeout() {
  local t=$1
  if [ "$DEADLINE" -gt 0 ] && [ $((DEADLINE - SECONDS - 15)) -lt "$t" ]; then t=$((DEADLINE - SECONDS - 15)); fi
  echo "$t"
}
finish() {
  echo "== summary (logs under $LOGS)"
  printf '  %s\n' "${summary[@]}"
  exit "$1"
}

# --- compute-sanitizer: $COMPUTE_SANITIZER, PATH, next to nvcc, the usual toolkit folders, and
# the nvidia-cuda-sanitizer-api wheel.
find_sanitizer() {
  local c nvcc_path nvcc_dir=""
  if [ -n "${COMPUTE_SANITIZER:-}" ]; then echo "$COMPUTE_SANITIZER"; return; fi
  if c=$(command -v compute-sanitizer 2>/dev/null); then echo "$c"; return; fi
  if nvcc_path=$(command -v nvcc 2>/dev/null); then nvcc_dir=$(dirname "$(readlink -f "$nvcc_path")"); fi
  for c in ${nvcc_dir:+"$nvcc_dir/compute-sanitizer" "$nvcc_dir/../compute-sanitizer/compute-sanitizer"} \
           ${CUDA_HOME:+"$CUDA_HOME/bin/compute-sanitizer"} ${CUDA_PATH:+"$CUDA_PATH/bin/compute-sanitizer"} \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
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
CS=""
if [ -n "$TOOLS" ]; then
  CS=$(find_sanitizer) || CS=""
  if [ -z "$CS" ] || [ ! -x "$CS" ]; then
    echo "sanitize.sh: compute-sanitizer not found (looked at \$COMPUTE_SANITIZER, PATH, next to" \
         "nvcc, \$CUDA_HOME/bin, /usr/local/cuda*/bin, /opt/nvidia, the nvidia wheels). It ships" \
         "with the CUDA toolkit; point COMPUTE_SANITIZER at it." >&2
    exit 2
  fi
  echo "compute-sanitizer: $CS ($("$CS" --version 2>/dev/null | grep -m1 -i version))"
fi

# --- 1. build
if [ -z "${TCGEMM_ARCH:-}" ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  TCGEMM_ARCH=sm_${cap:-90}
fi
# --split-compile: each kernel TU optimizes its kernels on several threads (the four sm80 TUs
# and the sm90 one dominate the build; nvcc: "minimal (if any) impact on performance")
F=(-std=c++17 -O3 -lineinfo --expt-relaxed-constexpr "--split-compile=${SPLIT_COMPILE:-4}" "-I$REPO/ffi")
echo "== build ($TCGEMM_ARCH, $JOBS jobs)"
t0=$SECONDS
srcs=("$REPO"/ffi/kernels/*/*.cu "$REPO/ffi/host/gemm_dispatch.cc" "$REPO/tools/kernel_selftest.cu"
      "$REPO/tools/selftest_epilogue.cu" "$REPO/tools/selftest_ragged.cu" "$REPO/tools/selftest_byte.cu")
[ "$(cat "$BUILD/arch" 2>/dev/null)" = "$TCGEMM_ARCH" ] || rm -f "$BUILD"/*.o "$BUILD/selftest"
echo "$TCGEMM_ARCH" >"$BUILD/arch"
for o in "$BUILD"/*.o; do  # objects of sources that no longer exist
  [ -e "$o" ] || continue
  keep=0; for src in "${srcs[@]}"; do [ "$o" = "$BUILD/$(basename "$src").o" ] && keep=1; done
  [ $keep = 1 ] || rm -f "$o"
done
compile() {  # source object: nvcc, log next to the object; the object removed on failure
  local src=$1 obj=$2 flags=("${F[@]}" "-arch=$TCGEMM_ARCH")
  # the wgmma kernels exist only for sm_90a (on other GPUs they are never launched)
  if [[ "$(basename "$src")" == kernels_sm90*.cu ]] && [ "$TCGEMM_ARCH" = sm_90 ]; then
    flags=("${F[@]}" -gencode=arch=compute_90a,code=sm_90a)
  fi
  nvcc "${flags[@]}" -x cu -c "$src" -o "$obj" >"$obj.log" 2>&1 || { rm -f "$obj"; return 1; }
}
built=0; objs=()
for src in "${srcs[@]}"; do
  obj="$BUILD/$(basename "$src").o"
  objs+=("$obj")
  # rebuilt when missing or older than the source, anything under ffi/ or a tools/ header
  if [ -e "$obj" ] && [ -z "$(find "$REPO/ffi" "$REPO"/tools/*.cuh "$src" -newer "$obj" -print -quit)" ]; then
    continue
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  compile "$src" "$obj" &
  built=$((built + 1))
done
wait
build_ok=1
for obj in "${objs[@]}"; do [ -e "$obj" ] || build_ok=0; done
if [ $build_ok = 1 ] && { [ $built -gt 0 ] || [ ! -x "$BUILD/selftest" ]; }; then
  nvcc "-arch=$TCGEMM_ARCH" "$BUILD"/*.o -o "$BUILD/selftest" >"$BUILD/link.log" 2>&1 || build_ok=0
fi
if [ $build_ok = 0 ]; then
  echo "sanitize.sh: build failed:"
  for l in "$BUILD"/*.log; do grep -qiE "error" "$l" && { echo "--- $l"; grep -m 20 -iE -B2 -A3 "error" "$l"; }; done
  note "build: FAILED ($((SECONDS - t0)) s)"
  finish 1
fi
note "build: ok, $built of ${#srcs[@]} objects compiled ($((SECONDS - t0)) s)"

status=0
result_line() { grep -E "^[0-9]+ passed, [0-9]+ failed$" "$1" | tail -1; }

# --- 2. the full self-test
if [ "${SANITIZE_FULL:-1}" != 0 ] && [ "$(step_timeout 900)" -le 0 ]; then
  note "selftest full: SKIPPED (deadline)"; status=1
elif [ "${SANITIZE_FULL:-1}" != 0 ]; then
  echo "== self-test (full)"
  t0=$SECONDS
  timeout "$(step_timeout 900)" "$BUILD/selftest" ${SANITIZE_FULL_ARGS:-} >"$LOGS/selftest_full.log" 2>&1
  rc=$?
  grep -E "^(FAIL|plain|epilogue|dact|ragged|byte|coverage)|^  " "$LOGS/selftest_full.log" | head -40
  line=$(result_line "$LOGS/selftest_full.log")
  note "selftest full: ${line:-no result line} (exit $rc, $((SECONDS - t0)) s)"
  [ $rc = 0 ] || status=1
fi

# --- 3. the quick list natively, then under each tool
echo "== self-test $ARGS (no tool)"
t0=$SECONDS
if [ "$(step_timeout 300)" -le 0 ]; then note "selftest $ARGS: SKIPPED (deadline)"; finish 1; fi
timeout "$(step_timeout 300)" "$BUILD/selftest" $ARGS >"$LOGS/quick_native.log" 2>&1
rc=$?
grep -E "^(FAIL|epilogue|dact|coverage)|^  " "$LOGS/quick_native.log" | head -30
line=$(result_line "$LOGS/quick_native.log")
note "selftest $ARGS: ${line:-no result line} (exit $rc, $((SECONDS - t0)) s)"
if [ $rc != 0 ]; then
  echo "sanitize.sh: the quick list fails without a sanitizer: no tool run"
  finish 1
fi

for tool in $TOOLS; do
  case $tool in
    memcheck)  extra=(--leak-check full --padding 256) ;;
    racecheck) extra=(--racecheck-report all) ;;
    *)         extra=() ;;
  esac
  limit=$(step_timeout "${SANITIZE_TIMEOUT:-900}")
  if [ "$limit" -le 0 ]; then note "$tool: SKIPPED (deadline)"; status=1; continue; fi
  echo "== $tool (timeout $limit s)"
  t0=$SECONDS
  timeout "$limit" "$CS" --tool "$tool" --error-exitcode 86 --print-limit 50 \
    "${extra[@]}" "$BUILD/selftest" $ARGS >"$LOGS/$tool.log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  grep -E "(ERROR|RACECHECK) SUMMARY" "$LOGS/$tool.log" | tail -2
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+" "$LOGS/$tool.log" | grep -oE "[0-9]+$" | tail -1)
  race=$(grep -oE "RACECHECK SUMMARY:.*" "$LOGS/$tool.log" | tail -1)
  race_errors=$(echo "$race" | grep -oE "[0-9]+ error" | grep -oE "[0-9]+" | tail -1)
  race_warnings=$(echo "$race" | grep -oE "[0-9]+ warning" | grep -oE "[0-9]+" | tail -1)
  errors=${errors:-$race_errors}
  line=$(result_line "$LOGS/$tool.log")
  if grep -qiE "device not supported|unable to (create|attach)|target application .*not supported|error 999" "$LOGS/$tool.log"; then
    note "$tool: NO VERDICT: compute-sanitizer could not attach on this machine ($secs s)"
    grep -m3 -iE "not supported|unable|error 999" "$LOGS/$tool.log"
    [ $status = 1 ] || status=2
  elif [ $rc = 124 ] || [ $rc = 137 ]; then
    note "$tool: TIMED OUT after $limit s: no verdict (raise SANITIZE_TIMEOUT / the deadline, or split by SELFTEST_CONFIGS)"
    grep -m 20 -E "^========= " "$LOGS/$tool.log"
    status=1
  elif [ $rc != 0 ] || [ -z "$errors" ] || [ "$errors" != 0 ] || [ "${race_errors:-0}" != 0 ]; then
    note "$tool: FAILED: ${errors:-?} errors${race:+ ($race)}, self-test ${line:-no result line} (exit $rc, $secs s)"
    grep -m 40 -E "^========= " "$LOGS/$tool.log" | head -40
    grep -E "^FAIL" "$LOGS/$tool.log" | head -5
    status=1
  else
    note "$tool: 0 errors${race_warnings:+, $race_warnings warnings}; self-test ${line:-?} ($secs s)"
  fi
done
[ $status = 0 ] && note "sanitize.sh: all clean (tools: ${TOOLS:-none})"
finish $status
