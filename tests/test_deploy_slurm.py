"""deploy/slurm's torchrun and deepspeed scripts: they parse, pass shellcheck, and launch a real module.

Each script runs against stand-ins for ``scontrol``, ``srun`` and ``deepspeed`` that
record their argv; the test checks the node count, the rendezvous and hostfile built
from the allocation, and that the recipe module it names exists and accepts the
arguments it is given. (``deploy/slurm/horovod.sbatch`` has its own tests.)
"""

from __future__ import annotations

import importlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from support import require_or_skip

SLURM = Path(__file__).resolve().parents[1] / "deploy" / "slurm"
SCRIPTS = ("torchrun.sbatch", "deepspeed.sbatch")


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_parses_and_passes_shellcheck(name: str) -> None:
    run = subprocess.run(
        ["bash", "-n", str(SLURM / name)], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    if shutil.which("shellcheck") is None:  # make test installs it (make debs) and requires it
        require_or_skip("shellcheck", "shellcheck is not installed (apt-get install shellcheck)")
    run = subprocess.run(
        ["shellcheck", str(SLURM / name)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run(tmp_path: Path, name: str, nodes: list[str], **env: str) -> list[str]:
    """Run ``name`` with stand-ins; return the argv the launcher (srun or deepspeed) received."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "scontrol", f'printf "%s\\n" {" ".join(nodes)}\n')
    for tool in ("srun", "deepspeed"):
        _stub(bin_dir / tool, f'printf "%s\\n" {tool} "$@" > "$ARGV_FILE"\n')
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    run_env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", ARGV_FILE=str(tmp_path / "argv"),
                   SLURM_JOB_NODELIST="gpu[x]", SLURM_JOB_ID="7", OUT_DIR=str(tmp_path / "out"),
                   **env)  # fmt: skip
    run = subprocess.run(
        ["bash", str(SLURM / name)], env=run_env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return (tmp_path / "argv").read_text().splitlines()


def _module_args(argv: list[str], flag: str) -> tuple[str, list[str]]:
    at = argv.index(flag)
    return argv[at + 1], argv[at + 2 :]


def _accepts(module: str, args: list[str]) -> None:
    try:
        importlib.import_module(module).parse_args(args)
    except SystemExit:
        pytest.fail(f"`python -m {module}` rejects {args}")


def test_torchrun_script_rendezvous_on_the_first_node(tmp_path: Path) -> None:
    argv = _run(tmp_path, "torchrun.sbatch", ["gpu03", "gpu04"], PROCS_PER_NODE="4", EPOCHS="2")
    assert argv[0] == "srun" and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "gpu03:29500"
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    module, args = _module_args(argv, "-m")  # the first -m is torch.distributed.run
    module, args = _module_args(args, "-m")
    assert module == "ddtk.examples.cnn_ddp"
    _accepts(module, args)


def test_deepspeed_script_writes_a_hostfile_and_uses_slurm(tmp_path: Path) -> None:
    argv = _run(tmp_path, "deepspeed.sbatch", ["gpu05", "gpu06"], SLURM_NTASKS_PER_NODE="4",
                ZERO_STAGE="3")  # fmt: skip
    assert argv[0] == "deepspeed" and argv[argv.index("--launcher") + 1] == "slurm"
    assert (tmp_path / "out" / "hostfile").read_text() == "gpu05 slots=4\ngpu06 slots=4\n"
    assert argv[argv.index("--master_addr") + 1] == "gpu05"
    module, args = _module_args(argv, "--module")
    assert module == "ddtk.examples.cnn_deepspeed"
    assert args[args.index("--zero-stage") + 1] == "3"
    _accepts(module, args)
