#!/usr/bin/env bash
# Build Horovod 0.28.1 from the PyPI sdist against the torch in $PYTHON's environment,
# cache the wheel, and install it.
#
# Why a build script: Horovod 0.28.1 is the newest release and its CMake files ask for
# C++14, but torch >= 2.1 headers need C++17 (upstream fixed this in PR #3998, after the
# release). CMake 4 also refuses the old cmake_minimum_required() in Horovod's vendored
# third-party code unless CMAKE_POLICY_VERSION_MINIMUM is set. Its setup.py builds
# RelWithDebInfo (-O2 -g); the build type is patched to Release (-O3, no debug
# information): on 2 cores the build takes 104 s instead of 145 s, and the wheel is
# 1 MB instead of 18 MB.
#
# Usage: scripts/build_horovod.sh [--wheel-only] [PYTHON]   (default: .venv/bin/python)
# The wheel is cached under .cache/wheels/, keyed by the torch version and CUDA flag,
# so a second run only reinstalls it. --wheel-only builds the cached wheel and installs
# nothing: it needs only torch, numpy and cmake in the environment, so `make test` runs it
# while the rest of the environment installs.
set -euo pipefail

WHEEL_ONLY=0
if [ "${1:-}" = "--wheel-only" ]; then
  WHEEL_ONLY=1
  shift
fi
PY=${1:-.venv/bin/python}
HVD_VERSION=0.28.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE="$ROOT/.cache/wheels"
mkdir -p "$CACHE"

TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
# A CUDA build when torch is a CUDA build and a CUDA toolkit (nvcc) is found: the rule
# Horovod's own CMake (FindPytorch) applies, so it holds in a `docker build` with no GPU
# attached (deploy/images/learner/Dockerfile.gpu), and a CPU torch always builds for gloo.
HAS_CUDA=$("$PY" -c 'import torch; from torch.utils.cpp_extension import CUDA_HOME; print(int(torch.version.cuda is not None and CUDA_HOME is not None))')
KEY="torch${TORCH_VERSION}-cuda${HAS_CUDA}-release"
WHEEL_DIR="$CACHE/horovod-$HVD_VERSION-$KEY"

if [ "$WHEEL_ONLY" = 0 ] && [ -f "$WHEEL_DIR/.ok" ] \
   && "$PY" -c "import horovod.torch as h, sys; sys.exit(0 if h.gloo_built() else 1)" 2>/dev/null; then
  echo "horovod $HVD_VERSION is already installed for $KEY"
  exit 0
fi

if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
  echo "building horovod $HVD_VERSION for $KEY (takes about 2 minutes on 2 cores)"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$WORK"
  tar -xzf "$WORK/horovod-$HVD_VERSION.tar.gz" -C "$WORK"
  SRC="$WORK/horovod-$HVD_VERSION"
  # The C++17 change: top-level project standard and the torch extension's standard.
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/CMakeLists.txt" || { echo "C++17 patch did not apply" >&2; exit 1; }
  # Release instead of RelWithDebInfo (see the top of this file).
  sed -i "s/else 'RelWithDebInfo'/else 'Release'/" "$SRC/setup.py"
  grep -q "else 'Release'" "$SRC/setup.py" || { echo "build-type patch did not apply" >&2; exit 1; }
  # cmake from PyPI must be on PATH for setup.py; it sits beside $PY.
  export PATH="$(dirname "$PY"):$PATH"
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
  export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  if [ "$HAS_CUDA" = 1 ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
  else
    export HOROVOD_CPU_OPERATIONS=GLOO
  fi
  export MAKEFLAGS="-j$(nproc)"
  mkdir -p "$WHEEL_DIR"
  # --no-build-isolation: build against the torch already installed, not a fresh download.
  "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$WHEEL_DIR" "$SRC"
  echo "horovod $HVD_VERSION wheel built for $KEY"
fi
[ "$WHEEL_ONLY" = 1 ] && exit 0

"$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
"$PY" -m pip install --quiet "cloudpickle" "psutil" "pyyaml" "packaging"
"$PY" -c "import horovod.torch as h; assert h.gloo_built(), 'horovod was built without gloo'; print('horovod', h.__version__ if hasattr(h,'__version__') else '', 'gloo_built', h.gloo_built())"
touch "$WHEEL_DIR/.ok"
