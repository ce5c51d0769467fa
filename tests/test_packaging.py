"""The install story: versions, lock file, conda environment and CI entry point agree."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import yaml

import ddtk

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)  # type: ignore[union-attr]


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[lock.norm(name)] = version
    return pins


def test_version_is_single_sourced() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == ddtk.__version__


def test_lock_pins_torch_and_covers_every_declared_dependency() -> None:
    pins = _lock_pins()
    assert pins["torch"] == "2.13.0"
    missing = [name for name in lock.direct_dependencies() if name not in pins]
    assert not missing, f"declared in pyproject.toml but not locked: {missing}"


def test_environment_yml_matches_the_lock() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pins = _lock_pins()
    listed = {}
    for spec in pip_section:
        if spec == "-e .":
            continue
        name, version = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(.+)", spec).groups()  # type: ignore[union-attr]
        listed[lock.norm(name)] = version
    assert listed == {n: pins[n] for n in lock.direct_dependencies()}
    assert "python=3.11" in env["dependencies"]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make lab" in readme


def test_importing_ray_builds_no_iri_parser() -> None:
    """jsonschema 4.24+ (pulled by Jupyter's format-nongpl extra) imports rfc3987-syntax, whose
    import builds an Earley parser: seconds of CPU in each of the many processes of a Ray
    cluster. pyproject.toml keeps jsonschema below 4.24; this fails if it creeps back."""
    import subprocess
    import sys

    code = "import jsonschema, sys; print('rfc3987_syntax' in sys.modules or 'lark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert "rfc3987-syntax" not in _lock_pins()
