#!/usr/bin/env bash
# Kernel variants against HEAD in one GPU call, built here (benchmarks/NOTES.md v100).
#
#   tools/variant_ab.sh pack PATCH...   (here, clean tree) fills .whl/ (git-ignored, carried):
#     old/*.whl      HEAD's wheel;
#     NAME.bsdiff    per patch NAME.patch, that variant's module as a binary diff against HEAD's
#                    (a variant's whole wheel would not fit the 64 MiB carry beside HEAD's);
#     bsdiff4-*.whl  to apply them there; pipe_probe (tools/pipe_probe.cu), where nvcc is.
#   A patch may change only headers of the sm_90a kernels and kernels_sm90_byte.cu: each
#   variant is built incrementally in one build dir, with the headers' mtimes kept so that only
#   kernels_sm90_byte.cu recompiles (~4 min here, against ~13 for a clean build). So a variant is
#   its byte kernels: its other kernels are HEAD's, whatever the shared headers now say.
#   env: PY (python with the build deps, default python3), BUILD (default build/ab).
#
#   tools/variant_ab.sh run             (the GPU machine, repo root; logs under $OUT), in order:
#     the probe (if carried); HEAD's package into /tmp/old, each variant's beside it; per
#     variant and HEAD, gpc__cycles_elapsed.max of one NCU_ROW launch at base clock
#     (tools/ncu_stalls.py launch); ROUNDS rounds of bench processes alternating variants and
#     HEAD on CASES; then TESTS under the first variant. Each step starts only while more than
#     its share of WALL seconds is left.
#   env: WALL (default 540), CASES (default lowp_fp8_8192,lowp_fp8_8192_nt,lowp_fp8_block_8192),
#        NCU_ROW (default sm90_192x128x64_s4_g3_f8), NCU_MODES (default tensor), ROUNDS (3),
#        TESTS (default tests/test_scaled_gpu.py tests/test_scaled_batch_gpu.py; "" none).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
SO=jax_tcgemm/_tcgemm.cpython-312-x86_64-linux-gnu.so

pack() {
  local py=${PY:-python3} build=${BUILD:-$REPO/build/ab}
  local byte=ffi/kernels/sm90/kernels_sm90_byte.cu
  git diff --quiet HEAD || { echo "pack: the working tree differs from HEAD"; return 1; }
  patch_files() { git apply --numstat "$1" | cut -f3; }
  for patch in "$@"; do
    local files
    files=$(patch_files "$patch") || return 1
    if grep -qvE '^ffi/kernels/sm90/[a-z_0-9]+\.cuh$|^ffi/kernels/sm90/kernels_sm90_byte\.cu$' \
        <<<"$files"; then
      echo "pack: $patch changes more than the byte kernels: $files"; return 1
    fi
  done
  rm -rf .whl/old .whl/*.bsdiff && mkdir -p .whl/old
  local tmp
  tmp=$(mktemp -d)
  build_wheel() {  # $1: out dir (the byte kernels' object may be a variant's: recompiled)
    touch "$byte"
    "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$1" -C build-dir="$build" . \
      >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; return 1; }
  }
  build_wheel .whl/old || return 1
  unzip -p .whl/old/*.whl "$SO" >"$tmp/old.so"
  "$py" -m pip download -q --no-deps -d .whl bsdiff4 >/dev/null || return 1
  "$py" -m pip install -q --target "$tmp/bsd" .whl/bsdiff4-*.whl >/dev/null || return 1
  for patch in "$@"; do
    local name files stamps=() built
    name=$(basename "$patch" .patch)
    files=$(patch_files "$patch")
    for f in $files; do stamps+=("$(stat -c %y "$f")"); done
    stamp_back() {  # the files' mtimes as in HEAD's build (no other object goes stale)
      local i=0
      for f in $files; do touch -d "${stamps[$i]}" "$f"; i=$((i + 1)); done
    }
    git apply "$patch" && stamp_back || return 1
    build_wheel "$tmp/$name"
    built=$?
    git checkout -- $files && stamp_back  # HEAD's text back
    [ "$built" = 0 ] || return 1
    unzip -p "$tmp/$name"/*.whl "$SO" >"$tmp/$name.so"
    PYTHONPATH="$tmp/bsd" "$py" -c "import bsdiff4, sys; bsdiff4.file_diff(*sys.argv[1:])" \
      "$tmp/old.so" "$tmp/$name.so" ".whl/$name.bsdiff" || return 1
    echo "pack: $name ($(stat -c %s ".whl/$name.bsdiff") bytes of diff)"
  done
  touch "$byte"  # the build dir's byte object is the last variant's
  if command -v nvcc >/dev/null; then
    nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I ffi tools/pipe_probe.cu \
      -o .whl/pipe_probe || return 1
  fi
  rm -rf "$tmp"
  du -sh .whl
}

run() {
  local t0 wall=${WALL:-540}
  t0=$(date +%s)
  left() { echo $((wall - ($(date +%s) - t0))); }
  export PYTHONUNBUFFERED=1
  local out=${OUT:-$REPO/gpu_out}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader |
    tee "$out/smi.txt"
  if [ -x .whl/pipe_probe ]; then
    echo "== probe"
    timeout 90 .whl/pipe_probe >"$out/probe.txt" 2>&1
    echo "probe rc $?"
    grep -E "^mode" "$out/probe.txt"
  fi
  echo "== install"
  python3 -m pip install -q --no-deps --target /tmp/old .whl/old/*.whl >"$out/inst.log" 2>&1 ||
    { tail "$out/inst.log"; return 1; }
  python3 -m pip install -q --no-deps --target /tmp/bsd .whl/bsdiff4-*.whl >>"$out/inst.log" 2>&1
  local variants=()
  for d in .whl/*.bsdiff; do
    [ -e "$d" ] || continue
    local v
    v=$(basename "$d" .bsdiff)
    rm -rf "/tmp/$v" && cp -r /tmp/old "/tmp/$v"
    PYTHONPATH=/tmp/bsd python3 -c "import bsdiff4, sys; bsdiff4.file_patch(*sys.argv[1:])" \
      "/tmp/old/$SO" "/tmp/$v/$SO" "$d" || return 1
    variants+=("$v")
  done
  echo "variants: ${variants[*]}"
  echo "== ncu: gpc__cycles_elapsed.max of one launch on ${NCU_ROW:=sm90_192x128x64_s4_g3_f8}"
  for mode in ${NCU_MODES-tensor}; do
    for v in "${variants[@]}" old; do
      [ "$(left)" -lt 200 ] && break 2
      PYTHONPATH=/tmp/$v timeout 120 ncu --kernel-name regex:gemm_sm90_kernel --launch-count 1 \
        --clock-control base --metrics gpc__cycles_elapsed.max \
        python3 -P tools/ncu_stalls.py launch "$mode" "$NCU_ROW" >"$out/ncu_${mode}_$v.txt" 2>&1
      echo "$mode $v: $(grep -E 'gpc__cycles_elapsed.max' "$out/ncu_${mode}_$v.txt" |
        awk '{print $NF}')"
    done
  done
  echo "== bench processes, alternating"
  local cases=${CASES:-lowp_fp8_8192,lowp_fp8_8192_nt,lowp_fp8_block_8192}
  for i in $(seq "${ROUNDS:-3}"); do
    for v in "${variants[@]}" old; do
      [ "$(left)" -lt 150 ] && break 2
      (cd /tmp && PYTHONPATH=/tmp/$v timeout 150 python3 -m jax_tcgemm.bench --suite lowp \
        --cases "$cases" --json "$out/b_${v}_$i.json" >"$out/b_${v}_$i.log" 2>&1)
      echo "-- $v $i"
      grep -E "^ *lowp" "$out/b_${v}_$i.log"
    done
  done
  local tests=${TESTS-tests/test_scaled_gpu.py tests/test_scaled_batch_gpu.py}
  local tl=$(($(left) - 10))
  if [ -n "$tests" ] && [ "${#variants[@]}" -gt 0 ] && [ "$tl" -gt 40 ]; then
    echo "== GPU tests under ${variants[0]}"
    read -r -a files <<<"$tests"
    (cd /tmp && PYTHONPATH=/tmp/${variants[0]} TCGEMM_REQUIRE_GPU=1 timeout "$tl" \
      python3 -m pytest -q -p no:cacheprovider -m gpu -x "${files[@]/#/$REPO/}" \
      >"$out/pytest.log" 2>&1)
    echo "pytest rc $?"
    tail -5 "$out/pytest.log"
  fi
  echo "elapsed $(($(date +%s) - t0)) s"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) run ;;
  *) echo "usage: tools/variant_ab.sh pack PATCH... | run"; exit 2 ;;
esac
