"""Write requirements.lock (pip freeze of .venv) and environment.yml (its direct dependencies).

Run through ``make lock`` after changing dependencies in pyproject.toml. The test
suite checks that the two files agree with each other and with pyproject.toml.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL_ONLY = {"ddtk", "horovod"}  # the project itself, and the wheel `make horovod` builds


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct_dependencies() -> dict[str, str]:
    """Every dependency pyproject.toml declares (optional ones too): name -> its extras, e.g. ``[train]``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + [s for deps in project["optional-dependencies"].values() for s in deps]
    out: dict[str, str] = {}
    for spec in specs:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(\[[^\]]*\])?", spec)
        assert m, spec
        out.setdefault(norm(m.group(1)), m.group(2) or "")
    return out


def main() -> None:
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True).stdout
    pins = {}
    for line in freeze.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            if norm(name) not in LOCAL_ONLY:
                pins[norm(name)] = version.split("+")[0] if norm(name) == "torch" else version
    header = ["# Exact versions CI tests (pip constraints). Regenerate with: make lock",
              "# torch stays pinned to 2.13.0: any other spec pulls gigabytes of CUDA wheels on CPU machines."]  # fmt: skip
    (ROOT / "requirements.lock").write_text("\n".join(header + [f"{n}=={v}" for n, v in sorted(pins.items())]) + "\n")
    deps = [f"      - {n}{extras}=={pins[n]}" for n, extras in direct_dependencies().items() if n in pins]
    env = ["# Conda environment matching requirements.lock (checked by tests/test_packaging.py).",
           "# conda env create -f environment.yml && conda activate ddtk && make horovod",
           "name: ddtk", "channels:", "  - conda-forge", "dependencies:", "  - python=3.11", "  - pip", "  - pip:",
           *deps, "      - -e .", ""]  # fmt: skip
    (ROOT / "environment.yml").write_text("\n".join(env))
    print(f"requirements.lock: {len(pins)} pins; environment.yml: {len(deps)} direct dependencies")


if __name__ == "__main__":
    main()
