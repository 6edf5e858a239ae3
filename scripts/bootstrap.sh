#!/usr/bin/env bash
# Installs what colocated-rl builds against, skipping what is already there.
#
#   scripts/bootstrap.sh          the CPU path: Debian's packages (libtorch-dev 1.13, CPU only).
#   scripts/bootstrap.sh --cuda   the GPU path: Debian's C++ libraries without libtorch, a CUDA
#                                 PyTorch (libtorch inside the wheel), nvcc and NCCL from PyPI
#                                 in a virtual environment, then configures build-gpu/ against
#                                 them (build it with `cmake --build build-gpu`).
#
# GPU path, where things come from (each can be pointed elsewhere):
#   CRL_GPU_PYTHON   a python3 whose torch is a CUDA build, used as it is (no download). When
#                    unset, `python3` is used if its torch has CUDA and nvcc is on PATH or in
#                    /usr/local/cuda (the GPU machines); otherwise the venv below.
#   CRL_GPU_VENV     the venv made from PyPI (default .cache/gpu-venv): torch==$CRL_TORCH_VERSION
#                    and cuda-toolkit==$CRL_CUDA_TOOLKIT_VERSION's nvcc, headers and runtime, and
#                    (tests only) transformers: 5.1 GiB, and 7.9 GiB free on its disk while pip
#                    installs it (pip's cache is not used: it would keep a second copy of the wheels).
#   CRL_FLASHINFER_INCLUDE  FlashInfer's CUDA headers (the folder holding flashinfer/): default the
#                    flashinfer-python package beside the python's torch, else .gpu-deps/flashinfer/
#                    include (carried to machines without it: scripts/gpu-check.sh fetch-debs).
#                    flashinfer-python==$CRL_FLASHINFER_VERSION goes into the venv (no dependencies:
#                    only its headers are used).
#   CRL_GPU_BUILD    the build folder (default build-gpu); CRL_CUDA_ARCHS its CUDA architectures
#                    (default "80;90": A100/A800 and H100/H200).
#   CRL_GPU_PREFIX   a folder with Debian's C++ libraries unpacked into it (scripts/gpu-check.sh on a
#                    machine without apt): no Debian package is installed then.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CUDA_PATH=0
case "${1:-}" in
  "") ;;
  --cuda) CUDA_PATH=1 ;;
  -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "bootstrap: unknown argument '$1' (usage: scripts/bootstrap.sh [--cuda])" >&2; exit 2 ;;
esac

# The C++ libraries both paths build against.
packages=(
  build-essential cmake ninja-build pkg-config
  libgloo-dev
  libsentencepiece-dev libcpp-httplib-dev nlohmann-json3-dev
  libpcre2-dev libutf8proc-dev
  libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libbenchmark-dev
)
if [ $CUDA_PATH = 0 ]; then
  packages+=(
    libtorch-dev libopenblas0-pthread  # libtorch for the CPU (without OpenBLAS its fp32 matmul is ~2x slower)
    python3-torch  # tests only: tests/engine/hf_reference.py, the independent reference forward
  )
else
  packages+=(python3-venv)  # the PyPI venv
fi

apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # Tests only: Hugging Face's tokenizers (its Node binding) is the tokenizer reference. Machines
  # that carry another Node.js build (which bundles npm) keep it.
  if [ $CUDA_PATH = 0 ]; then
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    # Tests only: the venv the TensorBoard reader (PyPI's tensorboard) is installed into.
    python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
  fi
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "bootstrap: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

if [ $CUDA_PATH = 0 ]; then
  apt_install "${packages[@]}"
  exit 0
fi

# ---- The GPU path ----
if [ -z "${CRL_GPU_PREFIX:-}" ]; then
  # A python3 that already has venv (pyenv's, say) needs no python3-venv package.
  if python3 -c 'import ensurepip, venv' 2>/dev/null; then unset 'packages[-1]'; fi
  apt_install "${packages[@]}"
fi

# Pinned to what the GPU machines run (PyTorch 2.11 + CUDA 13.0): torch 2.11.0's wheel on PyPI is
# built for CUDA 13.0 and pins cuda-toolkit 13.0.2, whose extras bring the matching nvcc (13.0.88),
# its device headers and libdevice.
CRL_TORCH_VERSION=${CRL_TORCH_VERSION:-2.11.0}
CRL_CUDA_TOOLKIT_VERSION=${CRL_CUDA_TOOLKIT_VERSION:-13.0.2}
# FlashInfer's headers (its batch decode attention: kv/paged_attention_flashinfer.cu). 0.6.9 is the
# newest whose headers compile with CUDA 13.0's CCCL (0.6.10 on use cuda::fast_mod_div, CCCL 3.1+).
CRL_FLASHINFER_VERSION=${CRL_FLASHINFER_VERSION:-0.6.9}
VENV=${CRL_GPU_VENV:-$ROOT/.cache/gpu-venv}
BUILD=${CRL_GPU_BUILD:-$ROOT/build-gpu}

torch_has_cuda() { "$1" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; }
find_nvcc() {
  command -v nvcc 2>/dev/null && return 0
  [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc && return 0
  return 1
}
# nvcc beside a python's torch: the cuda-toolkit wheel's (nvidia/cu13/bin/nvcc in its site-packages).
wheel_nvcc() {
  "$1" -c 'import os, torch; s = os.path.dirname(os.path.dirname(torch.__file__)); print(next(p for p in (os.path.join(s, "nvidia", d, "bin", "nvcc") for d in ("cu13", "cu12")) if os.access(p, os.X_OK)))' 2>/dev/null
}

# The python whose torch is built against: CRL_GPU_PYTHON, or python3 where its torch has CUDA and
# an nvcc is at hand, or the venv.
PY=${CRL_GPU_PYTHON:-}
if [ -n "$PY" ]; then
  torch_has_cuda "$PY" || { echo "bootstrap: CRL_GPU_PYTHON=$PY has no CUDA build of torch" >&2; exit 1; }
elif torch_has_cuda python3; then
  if find_nvcc >/dev/null || wheel_nvcc python3 >/dev/null; then
    PY=$(command -v python3)
  else
    echo "bootstrap: python3's torch has CUDA but no nvcc is on PATH, in /usr/local/cuda or beside it: using the venv"
  fi
fi
if [ -z "$PY" ]; then
  PY=$VENV/bin/python
  if ! { [ -x "$PY" ] && "$PY" -c "import torch, transformers, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$CRL_TORCH_VERSION' else 1)" 2>/dev/null \
         && "$PY" -m pip show -q nvidia-cuda-nvcc >/dev/null 2>&1; }; then
    echo "bootstrap: making $VENV: torch==$CRL_TORCH_VERSION and cuda-toolkit==$CRL_CUDA_TOOLKIT_VERSION (nvcc, headers) from PyPI"
    # pip needs 7.9 GiB at its peak (the downloaded wheels beside the unpacked venv): say so before
    # it starts rather than with an OSError half-way through.
    mkdir -p "$(dirname "$VENV")"
    free_gib=$(df -Pk "$(dirname "$VENV")" | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
    if [ "$free_gib" -lt "${CRL_GPU_VENV_NEED_GIB:-9}" ]; then
      echo "bootstrap: $free_gib GiB free on the disk of $(dirname "$VENV"); the GPU path's venv needs ${CRL_GPU_VENV_NEED_GIB:-9} GiB while pip installs it (5.1 GiB after). Free some space, point CRL_GPU_VENV at another disk, or use a python3 whose torch has CUDA (CRL_GPU_PYTHON)." >&2
      exit 1
    fi
    start=$(date +%s)
    python3 -m venv "$VENV"
    # transformers: tests only, the second forward reference (tests/engine/hf_transformers_reference.py).
    "$PY" -m pip install -q --no-cache-dir --disable-pip-version-check "torch==$CRL_TORCH_VERSION" \
      "cuda-toolkit[nvcc,crt,cccl,nvvm,cudart]==$CRL_CUDA_TOOLKIT_VERSION" \
      "transformers==${CRL_TRANSFORMERS_VERSION:-5.24.0}"
    "$PY" -m pip install -q --no-cache-dir --disable-pip-version-check --no-deps "flashinfer-python==$CRL_FLASHINFER_VERSION"
    echo "bootstrap: venv ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
  elif ! "$PY" -m pip show -q flashinfer-python >/dev/null 2>&1; then  # a venv from before it
    "$PY" -m pip install -q --no-cache-dir --disable-pip-version-check --no-deps "flashinfer-python==$CRL_FLASHINFER_VERSION"
  fi
fi

# Where the wheels put CUDA: one tree (nvidia/cu13: bin/nvcc, include, lib) and NCCL beside it.
found=$("$PY" - <<'EOF'
import os, shlex, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
def first(*cands):
    return next((c for c in cands if os.path.exists(c)), "")
vals = {
    "TORCH_CMAKE": torch.utils.cmake_prefix_path,
    "TORCH_VER": torch.__version__,
    "TORCH_CUDA": torch.version.cuda or "",
    "WHEEL_CUDA": first(*[os.path.join(site, "nvidia", d) for d in ("cu13", "cu12")]),
    "WHEEL_NCCL": first(os.path.join(site, "nvidia", "nccl")),
    "TORCH_LIB": os.path.join(os.path.dirname(torch.__file__), "lib"),
    "WHEEL_FLASHINFER": first(os.path.join(site, "flashinfer", "data", "include")),
}
for k, v in vals.items():
    print(f"{k}={shlex.quote(v)}")
EOF
) || { echo "bootstrap: $PY could not describe its torch" >&2; exit 1; }
eval "$found"
FLASHINFER_INCLUDE=${CRL_FLASHINFER_INCLUDE:-$WHEEL_FLASHINFER}
[ -n "$FLASHINFER_INCLUDE" ] || [ ! -d "$ROOT/.gpu-deps/flashinfer/include" ] \
  || FLASHINFER_INCLUDE=$ROOT/.gpu-deps/flashinfer/include
[ -f "$FLASHINFER_INCLUDE/flashinfer/attention/decode.cuh" ] || {
  echo "bootstrap: no FlashInfer headers (flashinfer-python beside $PY's torch, CRL_FLASHINFER_INCLUDE or .gpu-deps/flashinfer/include)" >&2; exit 1; }

# nvcc: the wheel's beside this torch (it matches the torch it was pinned with), else the system's.
NVCC=""
CUDA_ROOT=""
if [ -x "$WHEEL_CUDA/bin/nvcc" ]; then
  NVCC=$WHEEL_CUDA/bin/nvcc
  CUDA_ROOT=$WHEEL_CUDA
  # CMake's FindCUDA/FindCUDAToolkit look for the unversioned names a toolkit install has; the
  # wheels ship only libX.so.N. Link the names beside them (in the venv, or a writable install).
  if [ -w "$CUDA_ROOT/lib" ]; then
    for l in "$CUDA_ROOT"/lib/lib*.so.*; do
      base=${l##*/}; name=${base%%.so.*}.so
      case $base in *.alt.so.*) continue ;; esac
      [ -e "$CUDA_ROOT/lib/$name" ] || ln -s "$base" "$CUDA_ROOT/lib/$name"
    done
    # FindCUDA tries lib64 first.
    [ -e "$CUDA_ROOT/lib64" ] || ln -s lib "$CUDA_ROOT/lib64"
  elif [ ! -e "$CUDA_ROOT/lib/libcudart.so" ]; then
    echo "bootstrap: $CUDA_ROOT/lib has no libcudart.so for CMake and is not writable here" >&2
    exit 1
  fi
fi
[ -n "$NVCC" ] || NVCC=$(find_nvcc) || true
[ -n "$NVCC" ] || { echo "bootstrap: no nvcc found (PATH, /usr/local/cuda, or the nvidia-cuda-nvcc wheel beside $PY's torch)" >&2; exit 1; }
NVCC_VER=$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
if [ "${NVCC_VER%%.*}" != "${TORCH_CUDA%%.*}" ]; then
  echo "bootstrap: nvcc $NVCC_VER ($NVCC) and torch's CUDA $TORCH_CUDA differ in their major version" >&2
  exit 1
fi
[ -n "$CUDA_ROOT" ] || CUDA_ROOT=$(cd "$(dirname "$NVCC")/.." && pwd)
NCCL_INCLUDE=""
for d in "$WHEEL_NCCL/include" "$CUDA_ROOT/include" /usr/include; do
  [ -f "$d/nccl.h" ] && NCCL_INCLUDE=$d && break
done
[ -n "$NCCL_INCLUDE" ] || { echo "bootstrap: no nccl.h (install nvidia-nccl-cu13 into $PY's environment)" >&2; exit 1; }

echo "bootstrap: GPU path: torch $TORCH_VER (CUDA $TORCH_CUDA) from $PY; nvcc $NVCC_VER; nccl.h in $NCCL_INCLUDE; FlashInfer headers in $FLASHINFER_INCLUDE"
extra=()
[ -n "${CRL_GPU_PREFIX:-}" ] && extra+=(-DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$CRL_GPU_PREFIX/usr") \
  || extra+=(-DCMAKE_PREFIX_PATH="$TORCH_CMAKE")
mkdir -p "$BUILD"
ARCHS=${CRL_CUDA_ARCHS:-80;90}
# CRL_GPU_PATH makes the configure fail unless the CUDA kernels, the NCCL backend and CUDA IPC are
# all built: this folder never quietly becomes a second CPU build.
PATH=$(dirname "$NVCC"):$PATH cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCRL_GPU_PATH=ON "${extra[@]}" -DTorch_DIR="$TORCH_CMAKE/Torch" -DPython_EXECUTABLE="$PY" \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_ROOT" -DCUDAToolkit_ROOT="$CUDA_ROOT" \
  -DCRL_CUDA_ARCHITECTURES="$ARCHS" -DCRL_NCCL_INCLUDE_DIR="$NCCL_INCLUDE" \
  -DCRL_FLASHINFER_INCLUDE_DIR="$FLASHINFER_INCLUDE" \
  ${CRL_GPU_CMAKE_ARGS:-} > "$BUILD/configure.log" 2>&1 \
  || { tail -30 "$BUILD/configure.log"; echo "bootstrap: configuring $BUILD failed (log: $BUILD/configure.log)" >&2; exit 1; }
grep -E "colocated-rl:" "$BUILD/configure.log" | sed 's/^-- /bootstrap: /'
# What the binaries find at run time (libtorch, its CUDA libraries, NCCL, which is loaded by name):
# `. build-gpu/gpu-env.sh` before running them elsewhere than from the build's own RUNPATH.
libs=$TORCH_LIB
for d in "$WHEEL_NCCL/lib" "$WHEEL_CUDA/lib"; do [ -d "$d" ] && libs=$libs:$d; done
{
  echo "# Written by scripts/bootstrap.sh --cuda: the run-time environment of this GPU build."
  echo "export LD_LIBRARY_PATH=$(printf %q "$libs")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
  echo "export CRL_TORCH_VERSION_FOUND=$(printf %q "$TORCH_VER")"
  echo "export CRL_GPU_PYTHON=$(printf %q "$PY")"
} > "$BUILD/gpu-env.sh"
echo "bootstrap: configured $BUILD; build it with: cmake --build ${BUILD#$ROOT/}"
