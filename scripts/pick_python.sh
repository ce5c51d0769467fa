#!/usr/bin/env bash
# Print the CPython that `make` builds .venv from: the first of Debian's /usr/bin/python3.11,
# python3.11 on PATH and python3 that can make a venv (ensurepip) and has its C headers
# (Horovod and DeepSpeed's CPU op compile against them).
#
# Debian's python3.11 comes first because Debian builds it with profile-guided and
# link-time optimisation, in one static binary; pyenv's default build (--enable-shared,
# neither) runs Python code markedly slower. Measured on 2 cores: a pure-Python loop
# 68.8 ms against 40.4 ms, `import torch` 2.10 s against 1.83 s of CPU, and
# tests/test_examples.py, test_judging.py and test_collectives.py under `pytest -n 2`
# 222 s and 343 CPU-s against 176 s and 273 CPU-s. Set PYTHON=... to choose another.
set -uo pipefail

usable() {
  "$1" - <<'PY' 2>/dev/null
import ensurepip, os, sys, sysconfig, venv
ok = sys.version_info[:2] >= (3, 11)
sys.exit(0 if ok and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY
}

for py in /usr/bin/python3.11 "$(command -v python3.11)" "$(command -v python3)"; do
  if [ -n "$py" ] && [ -x "$py" ] && usable "$py"; then
    echo "$py"
    exit 0
  fi
done
# none qualifies: the first that exists, so that venv's own error names what is missing
command -v python3.11 || command -v python3
