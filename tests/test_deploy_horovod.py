"""deploy/kubeflow and deploy/slurm: lab 02's Horovod job on Kubernetes and under Slurm.

The MPIJob validates against the MPI operator's CRD (``ddtk.manifests``); the command its
launcher runs starts a module the package has, with flags that module accepts. The Slurm
script passes ``bash -n`` and shellcheck (where installed), and, run against stand-ins for
``scontrol`` and ``horovodrun``, builds the ``-H`` list and ``-np`` from the allocation.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from support import require_or_skip

from ddtk.manifests import validate_file

ROOT = Path(__file__).resolve().parents[1]
MPIJOB = ROOT / "deploy" / "kubeflow" / "horovod-mpijob.yaml"
SBATCH = ROOT / "deploy" / "slurm" / "horovod.sbatch"
MODULE = "ddtk.examples.cnn_horovod"


def _launcher_command() -> list[str]:
    doc = yaml.safe_load(MPIJOB.read_text())
    container = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    return [str(a) for a in container.get("command", []) + container.get("args", [])]


def _python_module(argv: list[str]) -> tuple[str, list[str]]:
    """``(module, its arguments)`` of the ``python -m module ...`` inside a launcher command."""
    at = next(i for i, a in enumerate(argv) if Path(a).name.startswith("python"))
    assert argv[at + 1] == "-m", f"expected `python -m <module>` in {argv}"
    return argv[at + 2], argv[at + 3 :]


def _parse_args(args: list[str]) -> None:
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        require_or_skip("horovod", f"{MODULE} does not import ({exc}): run `make horovod`")
    try:
        module.parse_args(args)
    except SystemExit:
        pytest.fail(f"`python -m {MODULE}` rejects the arguments {args}")


def test_mpijob_is_valid() -> None:
    errors = validate_file(MPIJOB)
    assert errors == [], "\n".join(errors)


def test_mpijob_launcher_runs_horovodrun_on_every_slot() -> None:
    doc = yaml.safe_load(MPIJOB.read_text())
    argv = _launcher_command()
    assert argv[0] == "horovodrun", argv
    specs = doc["spec"]["mpiReplicaSpecs"]
    slots = doc["spec"]["slotsPerWorker"] * specs["Worker"]["replicas"]
    assert argv[argv.index("-np") + 1] == str(slots), "-np must be replicas x slotsPerWorker"
    assert argv[argv.index("--hostfile") + 1] == "/etc/mpi/hostfile"


def test_mpijob_runs_a_module_of_the_package() -> None:
    module, _args = _python_module(_launcher_command())
    assert module == MODULE
    assert importlib.util.find_spec(module) is not None, f"the package has no module {module}"


@pytest.mark.horovod
def test_mpijob_module_accepts_its_arguments() -> None:
    _module, args = _python_module(_launcher_command())
    _parse_args(args)


def test_sbatch_parses() -> None:
    run = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_sbatch_passes_shellcheck() -> None:
    if shutil.which("shellcheck") is None:  # make test installs it (make debs) and requires it
        require_or_skip("shellcheck", "shellcheck is not installed (apt-get install shellcheck)")
    run = subprocess.run(["shellcheck", str(SBATCH)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_sbatch(tmp_path: Path, nodes: list[str], slots: int, **env: str) -> list[str]:
    """Run the script with stand-ins for scontrol and horovodrun; return horovodrun's argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(
        bin_dir / "scontrol",
        f'[[ "$*" == "show hostnames gpu[x]" ]] || exit 3\nprintf "%s\\n" {" ".join(nodes)}\n',
    )
    _stub(bin_dir / "horovodrun", 'printf "%s\\n" "$@" > "$ARGV_FILE"\n')
    argv_file = tmp_path / "argv"
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    run_env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", ARGV_FILE=str(argv_file),
        SLURM_JOB_NODELIST="gpu[x]", SLURM_NTASKS_PER_NODE=str(slots), SLURM_JOB_ID="42",
        OUT_DIR=str(tmp_path / "out"), **env,
    )  # fmt: skip
    run = subprocess.run(
        ["bash", str(SBATCH)], env=run_env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return argv_file.read_text().splitlines()


def test_sbatch_builds_the_host_list_from_the_allocation(tmp_path: Path) -> None:
    argv = _run_sbatch(tmp_path, ["gpu01", "gpu02", "gpu07"], slots=4, EPOCHS="3")
    assert argv[:5] == ["--gloo", "-np", "12", "-H", "gpu01:4,gpu02:4,gpu07:4"], argv
    assert argv[5:7] == ["python", "-m"] and argv[7] == MODULE, argv
    assert argv[argv.index("--epochs") + 1] == "3"
    assert (tmp_path / "out").is_dir()


def test_sbatch_launcher_can_be_mpi(tmp_path: Path) -> None:
    argv = _run_sbatch(tmp_path, ["n1"], slots=1, LAUNCHER="mpi")
    assert argv[:5] == ["--mpi", "-np", "1", "-H", "n1:1"], argv


@pytest.mark.horovod
def test_sbatch_module_accepts_its_arguments(tmp_path: Path) -> None:
    argv = _run_sbatch(tmp_path, ["gpu01", "gpu02"], slots=2)
    module, args = _python_module(argv)
    assert module == MODULE
    _parse_args(args)
