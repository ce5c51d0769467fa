"""ddtk.launch: results, argument checks, and every way a run can fail, on real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch
from support import default_sigint

import ddtk
from ddtk import RankError

pytestmark = pytest.mark.distributed


def _rank_info(ctx, scale):
    return {"rank": ctx.rank, "world": ctx.world_size, "master": ctx.is_master, "value": ctx.rank * scale,
            "threads": torch.get_num_threads(), "pid": os.getpid(), "device": str(ctx.device)}  # fmt: skip


def test_results_in_rank_order_with_args_and_kwargs() -> None:
    def work(ctx, a, b=0):
        return (ctx.rank, a, b)

    assert ddtk.launch(work, 3, args=("x",), kwargs={"b": 7}) == [
        (0, "x", 7),
        (1, "x", 7),
        (2, "x", 7),
    ]


def test_each_rank_is_its_own_process_on_one_thread() -> None:
    info = ddtk.launch(_rank_info, 3, args=(2.5,))
    assert [i["rank"] for i in info] == [0, 1, 2]
    assert [i["value"] for i in info] == [0.0, 2.5, 5.0]
    assert [i["master"] for i in info] == [True, False, False]
    assert all(i["threads"] == 1 and i["world"] == 3 and i["device"] == "cpu" for i in info)
    assert len({i["pid"] for i in info} | {os.getpid()}) == 4


def test_issue_example_all_reduce() -> None:
    def work(ctx, scale):
        return ctx.all_reduce(torch.full((5,), float(ctx.rank) * scale))

    for out in ddtk.launch(work, world_size=4, args=(2.0,), backend="auto", timeout=60):
        torch.testing.assert_close(out, torch.full((5,), 12.0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size must be an integer >= 1"),
        ({"world_size": 2.0}, "world_size must be an integer >= 1"),
        ({"world_size": 2, "backend": "mpi"}, "unknown backend 'mpi'"),
        ({"world_size": 2, "backend": "nccl"}, "backend='nccl' needs one CUDA GPU per local rank"),
        ({"world_size": 2, "timeout": 0}, "timeout must be a positive number"),
        ({"world_size": 2, "threads": 0}, "threads must be an integer >= 1"),
    ],
)
def test_bad_arguments_fail_before_spawning(kwargs, message) -> None:
    if kwargs.get("backend") == "nccl" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs that make nccl valid")
    before = len(psutil.Process().children(recursive=True))
    with pytest.raises(ValueError, match=message):
        ddtk.launch(_rank_info, args=(1,), **kwargs)
    assert len(psutil.Process().children(recursive=True)) == before


def test_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match="fn must be callable"):
        ddtk.launch("not a function", 2)  # type: ignore[arg-type]


def _fail_on_rank(ctx, bad_rank):
    if ctx.rank == bad_rank:
        raise ZeroDivisionError("rank-specific failure")
    ctx.barrier()  # the others block here until they are stopped
    return ctx.rank


def test_rank_exception_becomes_rank_error_and_others_stop_quickly() -> None:
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        ddtk.launch(_fail_on_rank, 4, args=(2,), timeout=60)
    assert info.value.rank == 2
    assert "ZeroDivisionError: rank-specific failure" in info.value.traceback
    assert "_fail_on_rank" in info.value.traceback  # the original traceback, not a summary
    assert time.monotonic() - start < 20


def _sigkill_self(ctx):
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.barrier()


def test_rank_killed_by_signal_is_reported() -> None:
    with pytest.raises(
        RankError, match=r"rank 1 died without reporting a result \(signal SIGKILL\)"
    ):
        ddtk.launch(_sigkill_self, 3, timeout=60)


def _hang_on_rank(ctx, slow):
    if ctx.rank in slow:
        time.sleep(600)
    return ctx.rank


def test_timeout_names_the_ranks_still_running() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank\(s\) 1, 2 were still running"):
        ddtk.launch(_hang_on_rank, 3, args=({1, 2},), timeout=8)
    assert time.monotonic() - start < 25


def _spawn_grandchild(ctx):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if ctx.rank == 0:
        raise RuntimeError(f"leaving grandchild {proc.pid} behind")
    time.sleep(600)


def test_processes_started_by_ranks_are_stopped_too() -> None:
    with pytest.raises(RankError):
        ddtk.launch(_spawn_grandchild, 2, timeout=60)
    # the autouse fixture in conftest.py fails the test if anything survived


def test_result_that_cannot_be_pickled_is_a_clear_error() -> None:
    def work(ctx):
        import threading

        return threading.Lock()

    with pytest.raises(RankError, match="return value could not be sent back"):
        ddtk.launch(work, 2)


def test_output_is_prefixed_by_rank(capfd) -> None:
    def work(ctx):
        print(f"hello {ctx.rank}")

    ddtk.launch(work, 2)
    out = capfd.readouterr().out
    assert "[rank 0] hello 0" in out and "[rank 1] hello 1" in out


def test_ctrl_c_stops_every_rank(tmp_path) -> None:
    """SIGINT to a script blocked in launch: it exits and no rank survives."""
    script = tmp_path / "sleepers.py"
    pids = tmp_path / "pids"
    script.write_text(
        textwrap.dedent(f"""
        import os, time, ddtk
        def work(ctx):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(600)
        ddtk.launch(work, 3, timeout=600)
    """)
    )
    # SIGINT at its default in the child whatever this run inherited (nohup, `&`): see support.
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not pids.exists() or len(pids.read_text().split()) < 3
        ):
            time.sleep(0.2)
        rank_pids = [int(p) for p in pids.read_text().split()]
        assert len(rank_pids) == 3
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # the interrupt did not stop it: leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            for pid in map(int, pids.read_text().split() if pids.exists() else []):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err
    time.sleep(0.5)
    assert not [
        p
        for p in rank_pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def test_script_without_main_guard_works(tmp_path) -> None:
    """Ranks (forked from the zygote, a fresh interpreter) never re-import __main__: no guard needed."""
    script = tmp_path / "noguard.py"
    script.write_text(
        textwrap.dedent("""
        import torch, ddtk
        def work(ctx):
            return float(ctx.all_reduce(torch.ones(3)).sum())
        print("RESULT", ddtk.launch(work, 2))
    """)
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RESULT [6.0, 6.0]" in out.stdout


def _reporting(ctx, path: str) -> int:
    import os
    import time

    for i in range(3):
        ctx.report({"rank": ctx.rank, "i": i})
    while not os.path.exists(path):  # the parent creates it only after it saw the reports
        time.sleep(0.01)
    print("bar 50%\rbar 100%")
    return ctx.rank


def test_reports_reach_the_parent_while_ranks_run(tmp_path, capfd) -> None:
    flag = tmp_path / "seen"
    got: list[tuple[int, dict]] = []

    def on_report(rank: int, value: dict) -> None:
        got.append((rank, value))
        if len(got) == 6:
            flag.touch()  # the ranks wait for this: reports must arrive before they return

    assert ddtk.launch(_reporting, 2, args=(str(flag),), on_report=on_report, timeout=60) == [0, 1]
    for rank in (0, 1):
        assert [v["i"] for r, v in got if r == rank] == [0, 1, 2]
    out = capfd.readouterr().out
    assert "[rank 1] bar 50%\r[rank 1] bar 100%\n" in out  # a redrawn line keeps its prefix


def _boom_report(rank: int, value: object) -> None:
    raise ValueError("plot failed")


def test_error_in_on_report_stops_the_ranks() -> None:
    with pytest.raises(ValueError, match="plot failed"):
        ddtk.launch(_reporting, 2, args=("/nonexistent/never",), on_report=_boom_report, timeout=60)


class _ListSink:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def flush(self) -> None: ...


def test_echo_never_glues_lines_of_two_ranks() -> None:
    """A progress bar left open by one rank is closed before another rank's line, then re-prefixed."""
    import threading

    from ddtk.launch import _echo

    sink = _ListSink()
    (ra, wa), (rb, wb) = os.pipe(), os.pipe()
    a = threading.Thread(target=_echo, args=(open(ra, "rb"), sink, "[a] ", None))  # noqa: SIM115 (_echo closes it)
    a.start()
    os.write(wa, b"x 50%\rx 100%")
    deadline = time.monotonic() + 10
    while "".join(sink.parts) != "[a] x 50%\r[a] x 100%" and time.monotonic() < deadline:
        time.sleep(0.01)
    os.write(wb, b"hello\n")
    os.close(wb)
    _echo(open(rb, "rb"), sink, "[b] ", None)  # noqa: SIM115
    os.write(wa, b"\nnext\n")
    os.close(wa)
    a.join(timeout=10)
    assert "".join(sink.parts) == "[a] x 50%\r[a] x 100%\n[b] hello\n[a] next\n"
