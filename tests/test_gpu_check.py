"""``make gpu-check`` (:mod:`ddtk.bench.gpu_check`) where there is no GPU, and its machinery.

Its GPU steps can only run on a GPU; here the tests prove that without one it stops at
once with a plain reason and writes nothing, that bad arguments are refused by name,
and that the parts which do not need a GPU (the command lines it would run, a step's
verdict from exit status and time, a skipped GPU test counted as a failure, the record
it writes into docs/benchmarks.md) do what they say.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ddtk.bench import gpu_check as gc

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path needs a machine without one")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddtk.bench.gpu_check", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)  # fmt: skip


def test_without_a_gpu_it_runs_nothing_and_says_why(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    start = time.perf_counter()
    done = _run("--out", str(tmp_path / "out"), "--record")
    assert done.returncode == gc.NO_GPU, done.stderr
    assert time.perf_counter() - start < 30  # an import and a question to torch, nothing more
    assert "needs an NVIDIA GPU" in done.stderr and "Nothing was run" in done.stderr
    assert "torch.cuda.is_available() is False" in done.stderr
    assert not (tmp_path / "out").exists()
    assert (ROOT / "docs" / "benchmarks.md").read_text() == doc


def test_make_gpu_check_runs_the_script_with_record() -> None:
    dry = subprocess.run(["make", "-n", "gpu-check", "VENV=.venv"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)  # fmt: skip
    assert "-m ddtk.bench.gpu_check --record" in dry.stdout, dry.stdout + dry.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--only", "tests,nccl"], "unknown step(s) nccl"),
        (["--only", ","], "unknown step(s) (none given)"),
        (["--time-limit", "0"], "--time-limit must be a positive number"),
        (["--time-limit", "soon"], "invalid float value"),
        (["--notebooks", "01,lecture99"], "unknown notebook(s) lecture99"),
    ],
)
def test_bad_arguments_are_refused_by_name(args: list[str], words: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        gc.main(["--out", str(tmp_path / "out"), *args])
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_every_command_line_it_would_run_parses() -> None:
    """The bench and course command lines are accepted by ddtk's own parsers."""
    from ddtk.bench.cli import bench_parser
    from ddtk.cli import build_parser

    for gpus in (1, 8):
        cmds = gc.commands(gc.Device(gpus, "test", "2.13.0", "12.8"), Path("/o"), list(gc.NOTEBOOKS))
        assert list(cmds) == gc.STEPS
        for argv in cmds["collectives"] + cmds["precision"]:
            bench_parser().parse_args(argv[argv.index("bench") + 1 :])
        ranks = cmds["collectives"][0][cmds["collectives"][0].index("-n") + 1]
        assert ranks == ("2" if gpus == 1 else "2,4,8")
        for argv in cmds["notebooks"]:
            args = build_parser().parse_args(argv[argv.index("course") :])
            assert "use_gpu=true" in args.param or "backend=nccl" in args.param, argv
            assert f"world_size={gpus}" in args.param or "world_size" not in " ".join(args.param)
        stages = [argv[argv.index("--zero-stage") + 1] for argv in cmds["deepspeed"]]
        assert stages == ["1", "2", "3"]
        assert all(f"--nproc-per-node={gpus}" in argv for argv in cmds["deepspeed"])


def test_a_step_is_judged_by_exit_status_and_stopped_at_its_time(tmp_path: Path) -> None:
    ok = [sys.executable, "-c", "print('fine')"]
    bad = [sys.executable, "-c", "raise SystemExit(4)"]
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    assert gc.run_step("a", [ok, ok], tmp_path, 60).status == "pass"
    failed = gc.run_step("b", [ok, bad, ok], tmp_path, 60)
    assert failed.status == "fail" and "[exit status 4]" in Path(failed.log).read_text()
    start = time.perf_counter()
    assert gc.run_step("c", [slow, ok], tmp_path, 2).status == "timeout"
    assert time.perf_counter() - start < 15


def test_a_skipped_gpu_test_fails_the_tests_step(tmp_path: Path) -> None:
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="5" failures="0" errors="0" skipped="1"/></testsuites>'
    )
    result = gc.run_step("tests", [[sys.executable, "-c", "pass"]], tmp_path, 60)
    assert result.detail == {"tests": 5, "failures": 0, "errors": 0, "skipped": 1}
    assert result.status == "fail"


def test_the_record_replaces_the_gpu_section_and_keeps_the_rest(tmp_path: Path, monkeypatch) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nbefore\n\n{gc.BEGIN}\nold\n{gc.END}\n\nafter\n")
    monkeypatch.setattr(gc, "DOC", doc)
    dev = gc.Device(1, "NVIDIA H100 80GB HBM3", "2.13.0+cu128", "12.8")
    results = [gc.StepResult("tests", "pass", 41.0), gc.StepResult("notebooks", "not run")]
    gc.record(dev, results, 301.0)
    text = doc.read_text()
    assert "old" not in text and text.startswith("# Benchmarks\n\nbefore") and text.endswith("after\n")
    assert "1 x NVIDIA H100 80GB HBM3" in text and "| notebooks | not run | 0 |" in text
    assert (tmp_path / "benchmarks-gpu.json").is_file()
    gc.record(dev, results, 302.0)  # a second run replaces, never appends
    assert doc.read_text().count(gc.BEGIN) == 1


def test_the_committed_doc_has_one_gpu_section() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert text.count(gc.BEGIN) == 1 and text.count(gc.END) == 1
