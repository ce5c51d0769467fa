"""ddtk.launch's zygote: ranks forked from a preloaded interpreter behave as new interpreters do.

Each check compares with what a rank started as ``python -m ddtk._rank`` sees
(``DDTK_LAUNCH_ZYGOTE=0``), or with the launcher's own state at the moment of the launch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

import ddtk
from ddtk import _forking

pytestmark = pytest.mark.distributed


def _where(ctx) -> dict:
    import os
    import sys

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "cwd": os.getcwd(),
        "probe": os.environ.get("DDTK_TEST_PROBE"),
        "rank_env": os.environ["RANK"],
        "path0": sys.path[0],
        "threads": torch.get_num_threads(),
        "sum": ctx.all_reduce(torch.ones(4) * (ctx.rank + 1)).tolist(),
        "session": os.getsid(0) == os.getpid(),
        "sigint": str(__import__("signal").getsignal(__import__("signal").SIGINT)),
        "cmd": Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(),
    }


def _zygote_pid() -> int:
    z = _forking._zygote
    assert z is not None and z.alive, "no zygote is running in this process"
    return z.proc.pid


@pytest.mark.parametrize("world", [1, 3])
def test_a_forked_rank_sees_what_a_new_interpreter_sees(world, tmp_path, monkeypatch) -> None:
    ddtk.launch(_where, 1)  # the zygote is running from here on
    monkeypatch.setenv("DDTK_TEST_PROBE", "set after the zygote started")
    monkeypatch.chdir(tmp_path)
    forked = ddtk.launch(_where, world, threads=2)
    monkeypatch.setenv("DDTK_LAUNCH_ZYGOTE", "0")
    fresh = ddtk.launch(_where, world, threads=2)
    zygote = _zygote_pid()
    want = sum(range(1, world + 1))
    for rank, (f, n) in enumerate(zip(forked, fresh, strict=True)):
        assert f["ppid"] == zygote and n["ppid"] == os.getpid()
        assert "-m ddtk._zygote" in f["cmd"] and "-m ddtk._rank" in n["cmd"]
        for key in ("cwd", "probe", "rank_env", "path0", "threads", "session", "sigint"):
            assert f[key] == n[key], (key, f[key], n[key])
        assert f["cwd"] == str(tmp_path) and f["rank_env"] == str(rank)
        assert f["sum"] == [float(want)] * 4 and f["threads"] == 2 and f["session"]


def test_functions_by_reference_from_a_path_added_after_the_zygote_started(tmp_path, monkeypatch):
    ddtk.launch(_where, 1)
    (tmp_path / "late_module_for_zygote.py").write_text(
        "def work(ctx):\n    return ctx.rank * 10\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_module_for_zygote

    assert ddtk.launch(late_module_for_zygote.work, 2) == [0, 10]


def test_one_zygote_serves_every_launch_and_starts_no_thread_before_it_forks() -> None:
    ddtk.launch(_where, 2)
    first = _zygote_pid()
    ddtk.launch(_where, 2)
    assert _zygote_pid() == first
    assert len(os.listdir(f"/proc/{first}/task")) == 1  # one thread: a fork copies a clean state
    assert _forking.is_zygote(psutil.Process(first))


def test_close_zygote_stops_it_and_the_next_launch_starts_another() -> None:
    """A notebook's last cell calls ``ddtk.close_zygote()``: the helper is gone (not left
    behind like a stray rank), a second call finds none, and launching again still works."""
    ddtk.launch(_where, 1)
    first = _zygote_pid()
    assert ddtk.close_zygote() is True
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in psutil.Process().children(recursive=True) if _forking.is_zygote(p)]
    assert ddtk.close_zygote() is False
    assert [r["sum"] for r in ddtk.launch(_where, 2)] == [[3.0] * 4] * 2
    assert _zygote_pid() != first


def _die(ctx, how: str) -> None:
    if ctx.rank == 1:
        if how == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


@pytest.mark.parametrize(("how", "said"), [("exit", "exit code 7"), ("kill", "signal SIGKILL")])
def test_a_rank_that_dies_is_reported_with_its_exit_status(how, said) -> None:
    with pytest.raises(ddtk.RankError, match=said):
        ddtk.launch(_die, 2, args=(how,), timeout=60)


def test_a_dead_zygote_is_replaced_and_its_ranks_are_reported(monkeypatch) -> None:
    ddtk.launch(_where, 1)
    old = _zygote_pid()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _forking._zygote.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    out = ddtk.launch(_where, 2)
    assert _zygote_pid() != old and out[0]["ppid"] == _zygote_pid()


_LAUNCHER = textwrap.dedent(
    """
    import os, sys, time, ddtk

    def spin(ctx):
        sys.stdout.write(f"running {os.getpid()} done\\n")  # one write: ranks' lines may interleave
        sys.stdout.flush()
        time.sleep(300)

    ddtk.launch(spin, 2, timeout=300)
    """
)


def test_the_zygote_and_its_ranks_die_with_their_launcher(tmp_path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        ranks = []
        deadline = time.monotonic() + 90
        while len(ranks) < 2 and time.monotonic() < deadline:
            found = re.search(r"running (\d+) done", proc.stdout.readline())
            if found:
                ranks.append(int(found.group(1)))
        family = psutil.Process(proc.pid).children(recursive=True)
        zygotes = [p for p in family if _forking.is_zygote(p) and p.pid not in ranks]
        assert len(ranks) == 2 and len(zygotes) == 1, (ranks, family)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _gone, alive = psutil.wait_procs([*zygotes, *map(psutil.Process, ranks)], timeout=15)
        assert not alive, f"outlived their launcher: {alive}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_without_the_zygote_ranks_are_new_interpreters(monkeypatch) -> None:
    monkeypatch.setenv("DDTK_LAUNCH_ZYGOTE", "0")
    out = ddtk.launch(_where, 2)
    for r in out:
        assert r["ppid"] == os.getpid() and "-m ddtk._rank" in r["cmd"], r
