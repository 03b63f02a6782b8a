#!/usr/bin/env bash
# One call on the GPU machine: build, kernel self-test, GPU tests, benchmark. Logs under $OUT.
#   usage: tools/gpu_check.sh [bench args...]      (default bench args: --quick)
#   env: TCGEMM_WHEEL=path.whl installs that wheel instead of building; TESTS="tests/a.py ..."
#        picks the test files; MARK="" runs every test of them, the CPU modules included (they
#        run on the CPU device: tests/conftest.py), not only `-m gpu` (the default MARK=gpu);
#        SKIP_SELFTEST=1 skips the standalone kernel self-test.
# The GPU machine is offline: the build uses what its python3 already has.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TCGEMM_REQUIRE_GPU=1
status=0
cd "$REPO"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

echo "== build"
t0=$(date +%s)
if [ -n "${TCGEMM_WHEEL:-}" ]; then  # a wheel built elsewhere from this tree (saves GPU time)
  cmd=(python3 -m pip install --no-deps --force-reinstall "$TCGEMM_WHEEL")
else
  cmd=(python3 -m pip install --no-build-isolation --no-deps .)
fi
if ! "${cmd[@]}" >"$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"; exit 1
fi
echo "installed (${cmd[*]}) in $(( $(date +%s) - t0 )) s"
cd /tmp  # import the installed package, not the source tree
so=$(python3 -c "import jax_tcgemm._tcgemm as m; print(m.__file__)") || exit 1
cuobjdump --list-elf "$so" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c

if [ "${SKIP_SELFTEST:-0}" != 1 ]; then
  echo "== kernel self-test"  # every kernel TU + the self-test, in parallel (sm90 TU: sm_90a)
  F=(-std=c++17 -O3 --expt-relaxed-constexpr --split-compile=4 "-I$REPO/ffi")
  rm -rf /tmp/st && mkdir -p /tmp/st
  for src in "$REPO"/ffi/kernels/*/*.cu "$REPO/ffi/host/gemm_dispatch.cc" \
             "$REPO/tools/kernel_selftest.cu" "$REPO/tools/selftest_epilogue.cu" \
             "$REPO/tools/selftest_ragged.cu" "$REPO/tools/selftest_byte.cu"; do
    arch=(-arch=sm_90)
    [[ "$(basename "$src")" == kernels_sm90*.cu ]] && arch=(-gencode=arch=compute_90a,code=sm_90a)
    nvcc "${F[@]}" "${arch[@]}" -x cu -c "$src" -o "/tmp/st/$(basename "$src").o" \
      >"/tmp/st/$(basename "$src").log" 2>&1 &
  done
  wait
  if nvcc -arch=sm_90 /tmp/st/*.o -o /tmp/st/selftest >/tmp/st/link.log 2>&1; then
    /tmp/st/selftest 2>&1 | tee "$OUT/selftest.log" | grep -E "^(FAIL|plain|epilogue|dact|ragged|byte)|passed, "
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  else
    echo "self-test build failed:"; cat /tmp/st/*.log | grep -m 20 -iE -A3 "error"; status=1
  fi
fi

echo "== GPU tests"
# TESTS: test files or node ids relative to the repository (default: all of tests/)
read -r -a tests <<<"${TESTS:-tests}"
MARK=${MARK-gpu}
python3 -m pytest "${tests[@]/#/$REPO/}" -q -p no:cacheprovider ${MARK:+-m "$MARK"} -rs 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== benchmark"
python3 -m jax_tcgemm.bench "${@:---quick}" --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>"$OUT/bench.err" | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
