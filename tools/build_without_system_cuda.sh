#!/usr/bin/env bash
# Shows that `pip install .` builds jax_tcgemm on a machine with NO system CUDA toolkit: the
# in-tree backend (_build_backend.py) then adds the CUDA 13.0 wheels (nvidia-cuda-nvcc,
# -runtime, -crt, -cccl, nvidia-nvvm) to the isolated build environment and CMakeLists.txt
# compiles with site-packages/nvidia/cu13/bin/nvcc.
#
# Where a toolkit IS installed, the script re-runs itself in a private mount namespace
# (unshare -m; needs root) with an empty tmpfs over every toolkit directory
# (/usr/local/cuda*, $CUDA_HOME, ...), drops every PATH entry holding an nvcc and unsets
# CUDA_HOME/CUDA_PATH/CUDACXX, so no system nvcc, header or library is reachable. Then: a
# fresh venv, `pip install -v <repo>`, and the evidence: which nvcc CMake used, the
# cubins in the built module (cuobjdump from the nvidia-cuda-cuobjdump wheel), its import.
#   usage: tools/build_without_system_cuda.sh          env: PYTHON (default python3.12), KEEP=1
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${PYTHON:-} ]]; then
  for c in /root/.pyenv/versions/3.12.1/bin/python3.12 python3.12 python3.13 python3; do
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      PYTHON=$(command -v "$c"); break
    fi
  done
fi
PY=${PYTHON:?"no Python >= 3.12 found; set PYTHON"}
export PYTHON

if [[ ${_TCGEMM_NO_CUDA_NS:-} != 1 ]]; then
  hide=() path=()
  for d in /usr/local/cuda /usr/local/cuda-* /opt/cuda /usr/lib/cuda "${CUDA_HOME:-}" \
           "${CUDA_PATH:-}"; do
    [[ -n $d && -d $d ]] && hide+=("$(readlink -f "$d")")
  done
  IFS=: read -r -a dirs <<<"$PATH"
  for d in "${dirs[@]}"; do
    if [[ -n $d && -e $d/nvcc ]]; then  # drop it from PATH; hide its toolkit if it is one
      root=$(dirname "$(dirname "$(readlink -f "$d/nvcc")")")
      [[ -e $root/include/cuda_runtime.h || -d $root/nvvm ]] && hide+=("$root")
    else
      path+=("$d")
    fi
  done
  newpath=$(IFS=:; echo "${path[*]}")
  if (( ${#hide[@]} )); then
    hide_list=$(printf '%s\n' "${hide[@]}" | sort -u | tr '\n' ':')
    echo "system CUDA found; hiding ${hide_list%:} in a private mount namespace"
    exec unshare -m --propagation private \
      env _TCGEMM_NO_CUDA_NS=1 _TCGEMM_HIDE="$hide_list" PATH="$newpath" bash "$0" "$@"
  fi
  export PATH=$newpath
fi

# ---- from here on, no system CUDA toolkit ----
IFS=: read -r -a hide <<<"${_TCGEMM_HIDE:-}"
for d in "${hide[@]}"; do
  [[ -n $d ]] && mount -t tmpfs -o ro,size=4k none "$d"
done
unset CUDA_HOME CUDA_PATH CUDACXX CUDAToolkit_ROOT CMAKE_ARGS PIP_NO_BUILD_ISOLATION \
      JAX_TCGEMM_CUDA_WHEELS
echo "== no system CUDA"
echo "PATH=$PATH"
echo "nvcc on PATH: $(command -v nvcc || echo none)"
for d in "${hide[@]}"; do [[ -n $d ]] && echo "$d: $(ls -A "$d" | wc -l) entries"; done
ls /usr/local/cuda/bin/nvcc 2>/dev/null && { echo "FAIL: /usr/local/cuda/bin/nvcc still visible"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tcgemm_nocuda.XXXXXX")
LOG=$WORK/build.log
echo "== fresh venv ($PY) and pip install -v $ROOT   (log: $LOG)"
"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
t0=$(date +%s)
if ! "$VPY" -m pip install -v -C build.verbose=true "$ROOT" >"$LOG" 2>&1; then
  tail -n 80 "$LOG"; echo "FAIL: pip install failed (log: $LOG)"; exit 1
fi
echo "built and installed in $(( $(date +%s) - t0 )) s"

echo "== evidence from the build log"
grep -E 'Successfully installed .*nvidia-cuda-nvcc' "$LOG" | sed 's/^ */build env: /'
grep -E 'using CMake|jax_tcgemm:|CUDA compiler identification|Found CUDAToolkit' "$LOG" | sed 's/^ *//'
grep -m1 -E 'cuda-wheel-toolkit/bin/nvcc .* -c .*\.cu ' "$LOG" | sed 's/^ *//' | cut -c1-400
grep -q 'jax_tcgemm: CUDA compiler from pip wheels' "$LOG" ||
  { echo "FAIL: the build did not use the CUDA wheels"; exit 1; }

echo "== the built module"
cd "$WORK"
SO=$("$VPY" -P -c 'import jax_tcgemm._tcgemm as m; print(m.__file__)')
"$VPY" -P -c 'import jax_tcgemm._tcgemm as m; print("imports; targets:", sorted(m.registrations()))'
echo "$SO"
readelf -d "$SO" | grep NEEDED || true
"$VPY" -m pip install -q --no-deps --target "$WORK/tools" 'nvidia-cuda-cuobjdump>=13,<14' >/dev/null 2>&1
CUOBJDUMP=$WORK/tools/nvidia/cu13/bin/cuobjdump
chmod +x "$CUOBJDUMP"
echo "\$ cuobjdump --list-elf $(basename "$SO")   (cuobjdump from the nvidia-cuda-cuobjdump wheel)"
ELFS=$("$CUOBJDUMP" --list-elf "$SO")
echo "$ELFS"
for arch in sm_80 sm_90; do
  grep -q "\.$arch\.cubin" <<<"$ELFS" || { echo "FAIL: no $arch cubin"; exit 1; }
done
echo "OK: built without a system CUDA toolkit; sm_80 and sm_90 SASS present"
[[ ${KEEP:-0} == 1 ]] && echo "kept $WORK" || rm -rf "$WORK"
