"""Fault injection on real processes, and the per-operation timeout that turns hangs into errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ddtk
from ddtk.comm.context import DEFAULT_OP_TIMEOUT, DistributedContext
from ddtk.faults import (
    CollectiveTimeoutError,
    FaultPlan,
    PeerLostError,
    corrupt_file,
    crash_during,
    hang,
    kill_at_step,
    raise_at_step,
    straggler,
    truncate_file,
)

pytestmark = pytest.mark.distributed

OP_TIMEOUT = 2.0
SLACK = 6.0  # the diagnosis grace (<= OP_TIMEOUT / 2) plus scheduling on a loaded machine


# -- rank functions ----------------------------------------------------------------------
def _survivor_writes_error(ctx, plan, out_dir, algorithm):
    """Every rank runs the plan at step 0, then all-reduces; survivors record how it failed."""
    if ctx.rank != 2:  # outlive the launcher's SIGTERM long enough to write the record
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Every survivor ignores SIGTERM before rank 2 fails: else the launcher's SIGTERM can
    # reach a rank still starting up, which then exits without a record.
    ctx.barrier()
    plan.maybe_fail(ctx, 0)
    start = time.monotonic()
    try:
        ctx.all_reduce(torch.ones(1000), algorithm=algorithm)
    except Exception as exc:
        record = {
            "type": type(exc).__name__,
            "message": str(exc),
            "seconds": time.monotonic() - start,
            "peers": getattr(exc, "peers", None),
            "missing": getattr(exc, "missing", None),
            "is_timeout": isinstance(exc, TimeoutError),
        }
        Path(out_dir, f"rank{ctx.rank}.json").write_text(json.dumps(record))
        raise
    return "finished"


def _read_records(out_dir: Path, ranks) -> dict[int, dict]:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not all(
        (out_dir / f"rank{r}.json").exists() for r in ranks
    ):
        time.sleep(0.1)
    return {r: json.loads((out_dir / f"rank{r}.json").read_text()) for r in ranks}


# -- 1. a hang becomes an error ----------------------------------------------------------
TRANSPORTS = ["shm", "tcp"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("validate", [False, True])
def test_hung_peer_raises_collective_timeout_naming_it(tmp_path, validate, transport):
    start = time.monotonic()
    with pytest.raises(ddtk.RankError) as info:
        ddtk.launch(
            _survivor_writes_error,
            3,
            args=(FaultPlan(hang(rank=2, step=0)), str(tmp_path), "ring"),
            timeout=60,
            validate=validate,
            echo=False,
            op_timeout=OP_TIMEOUT,  # reaches the ranks as DDTK_OP_TIMEOUT
            transport=transport,
        )
    assert time.monotonic() - start < 60  # the launcher's timeout never fired
    assert info.value.rank in (0, 1)
    assert "2 did not report being in all_reduce[ring]" in info.value.traceback
    records = _read_records(tmp_path, (0, 1))
    # Rank 0 waits for rank 2 and times out. Rank 1 times out too, or, when rank 0 gave up
    # and left first, loses its connection to rank 0: either way it names the hung rank 2.
    assert records[0]["type"] == "CollectiveTimeoutError" and records[0]["is_timeout"]
    assert records[1]["type"] in ("CollectiveTimeoutError", "PeerLostError")
    for rank, rec in records.items():
        assert f"rank {rank}: all_reduce[ring]" in rec["message"]
        assert 2 in rec["missing"], rec["message"]  # both name the hung rank
        assert "2 did not report being in all_reduce[ring]" in rec["message"]
        assert OP_TIMEOUT - 0.1 <= rec["seconds"] <= OP_TIMEOUT + SLACK
    if not validate:  # in the ring, rank 0 waits for rank 2 and rank 1 for rank 0
        assert records[0]["peers"] == [2] and "waiting for rank 2" in records[0]["message"]
        assert records[1]["peers"] == [0]
    else:
        assert "(argument check)" in records[0]["message"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dead_peer_gives_a_clear_error_not_a_hang(tmp_path, monkeypatch, transport):
    """The survivors see the lost connections in the argument check of their next collective."""
    monkeypatch.setenv("DDTK_OP_TIMEOUT", str(OP_TIMEOUT))
    start = time.monotonic()
    with pytest.raises(ddtk.RankError) as info:
        ddtk.launch(
            _survivor_writes_error,
            3,
            args=(FaultPlan(kill_at_step(rank=2, step=0)), str(tmp_path), "ring"),
            timeout=60,
            echo=False,
            transport=transport,
        )
    assert time.monotonic() - start < 30
    assert info.value.rank == 2 and "signal SIGKILL" in str(info.value)
    for rank, rec in _read_records(tmp_path, (0, 1)).items():
        assert rec["type"] == "PeerLostError", rec
        assert (
            f"rank {rank}: all_reduce[ring] (argument check) lost its connection" in rec["message"]
        )
        assert 2 in rec["missing"], rec["message"]
        assert rec["seconds"] <= OP_TIMEOUT + SLACK


def _recv_from_hung(ctx):
    if ctx.rank == 1:
        hang(1, 0)(ctx, 0)
    return ctx.recv(src=1, tag=3)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_recv_from_a_hung_peer_times_out(transport):
    with pytest.raises(ddtk.RankError) as info:
        ddtk.launch(
            _recv_with_timeout,
            2,
            timeout=60,
            echo=False,
            transport=transport,
        )
    assert info.value.rank == 0
    assert "CollectiveTimeoutError: rank 0: recv made no progress for 1.0 s waiting for rank 1" in (
        info.value.traceback
    )


def _recv_with_timeout(ctx):
    """Rebuild the context with an explicit op_timeout (the constructor argument path)."""
    ctx = DistributedContext(
        ctx.rank, ctx.world_size, ctx.backend, ctx.device, op_timeout=1.0, transport=ctx.transport
    )
    return _recv_from_hung(ctx)


def _many_ops(ctx):
    t = torch.arange(5, dtype=torch.float64) + 10 * ctx.rank
    out = {alg: ctx.all_reduce(t, algorithm=alg) for alg in ("ring", "tree", "torch")}
    out["broadcast"] = ctx.broadcast(t if ctx.rank == 0 else None, root=0)
    ctx.barrier()
    if ctx.world_size > 1:
        ctx.send(ctx.rank, (ctx.rank + 1) % ctx.world_size, tag=1)
        msg = ctx.recv(src=None, tag=1)
        out["recv_from"] = msg.src
        out["payload"] = msg.payload
    return out


@pytest.mark.parametrize(("world", "transport"), [(1, "shm"), (2, "shm"), (3, "shm"), (3, "tcp")])
def test_watched_collectives_stay_correct(world, monkeypatch, transport):
    monkeypatch.setenv("DDTK_OP_TIMEOUT", "30")
    results = ddtk.launch(_many_ops, world, timeout=120, echo=False, transport=transport)
    base = torch.arange(5, dtype=torch.float64)
    expected = sum(base + 10 * r for r in range(world))
    for rank, out in enumerate(results):
        for alg in ("ring", "tree", "torch"):
            torch.testing.assert_close(out[alg], expected)
        torch.testing.assert_close(out["broadcast"], base)
        if world > 1:
            assert out["recv_from"] == (rank - 1) % world == out["payload"]


def test_op_timeout_argument_is_checked(monkeypatch):
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="op_timeout must be >= 0"):
            DistributedContext(0, 1, "gloo", "cpu", op_timeout=bad)
    with pytest.raises(TypeError, match="op_timeout must be a number"):
        DistributedContext(0, 1, "gloo", "cpu", op_timeout="5")
    for bad, says in (("soon", "must be a number"), ("-3", "must be > 0"), ("inf", "must be > 0")):
        monkeypatch.setenv("DDTK_OP_TIMEOUT", bad)
        with pytest.raises(ValueError, match=f"DDTK_OP_TIMEOUT {says}"):
            DistributedContext(0, 1, "gloo", "cpu")
    monkeypatch.setenv("DDTK_OP_TIMEOUT", "7.5")
    assert DistributedContext(0, 1, "gloo", "cpu").op_timeout == 7.5
    assert DistributedContext(0, 1, "gloo", "cpu", op_timeout=2).op_timeout == 2.0
    assert DistributedContext(0, 1, "gloo", "cpu", op_timeout=0).op_timeout is None
    for off in ("off", "OFF", "none", "0"):
        monkeypatch.setenv("DDTK_OP_TIMEOUT", off)
        assert DistributedContext(0, 1, "gloo", "cpu").op_timeout is None
    monkeypatch.delenv("DDTK_OP_TIMEOUT")
    assert DistributedContext(0, 1, "gloo", "cpu").op_timeout == DEFAULT_OP_TIMEOUT == 300.0
    assert issubclass(CollectiveTimeoutError, TimeoutError)
    assert issubclass(PeerLostError, ConnectionError)


# -- 2. injectors ------------------------------------------------------------------------
def _train(ctx, plan, steps):
    for step in range(steps):
        plan.maybe_fail(ctx, step)
    return ctx.rank


def test_kill_at_step_is_reported_as_sigkill():
    with pytest.raises(ddtk.RankError) as info:
        ddtk.launch(_train, 2, args=(FaultPlan(kill_at_step(1, 2)), 4), timeout=60, echo=False)
    assert info.value.rank == 1
    assert info.value.exitcode == -signal.SIGKILL
    assert "signal SIGKILL" in str(info.value)


def test_raise_at_step_carries_the_original_exception():
    plan = FaultPlan(raise_at_step(0, 1, KeyError("shard-3")))
    with pytest.raises(ddtk.RankError) as info:
        ddtk.launch(_train, 2, args=(plan, 3), timeout=60, echo=False)
    assert info.value.rank == 0
    assert "KeyError: 'shard-3'" in info.value.traceback


def test_no_fault_before_its_step():
    plan = FaultPlan(kill_at_step(1, 5), raise_at_step(0, 5), hang(1, 5))
    assert ddtk.launch(_train, 2, args=(plan, 5), timeout=60, echo=False) == [0, 1]


def _timed_train(ctx, plan, steps):
    start = time.perf_counter()
    _train(ctx, plan, steps)
    return time.perf_counter() - start


def test_straggler_delays_only_its_rank():
    plan = FaultPlan(straggler(rank=1, seconds=0.2, every=2))
    times = ddtk.launch(_timed_train, 3, args=(plan, 6), timeout=60, echo=False)
    assert 0.6 <= times[1] < 0.6 + 1.0  # steps 0, 2 and 4
    assert times[0] < 0.1 and times[2] < 0.1


def test_fault_plan_checks_its_parts():
    with pytest.raises(TypeError, match="callables"):
        FaultPlan("kill rank 1")
    with pytest.raises(ValueError, match="rank must be an integer >= 0"):
        kill_at_step(-1, 0)
    with pytest.raises(ValueError, match="step must be"):
        hang(0, 1.5)
    with pytest.raises(ValueError, match="every must be"):
        straggler(0, 1.0, every=0)
    with pytest.raises(TypeError, match="exc must be"):
        raise_at_step(0, 0, "boom")
    plan = FaultPlan(straggler(1, 0.0, every=3)).add(kill_at_step(2, 4))
    assert plan.targets(3) == [1] and plan.targets(4) == [2] and plan.targets(5) == []


# -- file faults -------------------------------------------------------------------------
def test_corrupt_file_flips_exactly_the_requested_bytes(tmp_path):
    data = bytes(range(256)) * 4
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    offset = corrupt_file(path, nbytes=3, seed=7)
    after = path.read_bytes()
    assert len(after) == len(data)
    changed = [i for i in range(len(data)) if after[i] != data[i]]
    assert changed == [offset, offset + 1, offset + 2]
    assert all(after[i] == data[i] ^ 0xFF for i in changed)
    path.write_bytes(data)
    assert corrupt_file(path, nbytes=3, seed=7) == offset  # the seed makes it repeatable
    corrupt_file(path, offset=10)
    assert path.read_bytes()[10] == 10 ^ 0xFF
    with pytest.raises(ValueError, match="past the end"):
        corrupt_file(path, offset=len(data) - 1, nbytes=2)
    with pytest.raises(FileNotFoundError):
        corrupt_file(tmp_path / "missing.bin")


def test_truncate_file_to_fraction_or_size(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(b"x" * 1000)
    assert truncate_file(path, fraction=0.5) == 500 == path.stat().st_size
    assert truncate_file(path, size=123) == 123 == path.stat().st_size
    assert path.read_bytes() == b"x" * 123
    with pytest.raises(ValueError, match="exactly one"):
        truncate_file(path)
    with pytest.raises(ValueError, match=r"size must be an integer in \[0, 123\]"):
        truncate_file(path, size=124)
    with pytest.raises(ValueError, match="fraction must be in"):
        truncate_file(path, fraction=1.0)


_COMMIT_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from ddtk.faults import crash_during

    d = Path(sys.argv[1])
    with crash_during("os.replace", after_calls=int(sys.argv[2]), when=sys.argv[3]):
        for name in ("shard0", "shard1", "manifest"):
            (d / (name + ".tmp")).write_text(name)
            os.replace(d / (name + ".tmp"), d / name)
    print("committed")
    """
)


@pytest.mark.parametrize(
    ("after_calls", "when", "expected"),
    [
        (2, "before", ["shard0", "shard1.tmp"]),
        (3, "before", ["manifest.tmp", "shard0", "shard1"]),
        (3, "after", ["manifest", "shard0", "shard1"]),
    ],
)
def test_crash_during_kills_the_process_at_the_nth_call(tmp_path, after_calls, when, expected):
    proc = subprocess.run(
        [sys.executable, "-c", _COMMIT_SCRIPT, str(tmp_path), str(after_calls), when],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(ddtk.__file__).parent.parent)},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "committed" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == expected


def test_crash_during_can_raise_and_always_restores(tmp_path):
    original = os.replace
    (tmp_path / "a.tmp").write_text("a")
    fault = crash_during(os.replace, after_calls=1, exc=OSError("disk gone"))
    with pytest.raises(OSError, match="disk gone"), fault as calls:
        os.replace(tmp_path / "a.tmp", tmp_path / "a")
    assert calls["calls"] == 1 and os.replace is original
    assert (tmp_path / "a.tmp").exists() and not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="after_calls"), crash_during("os.replace", after_calls=0):
        pass
    with pytest.raises(ValueError, match="cannot find"), crash_during("os.no_such_function"):
        pass


def test_launch_rejects_a_bad_op_timeout() -> None:
    for bad in (-1.0, float("inf"), "5", True):
        with pytest.raises(ValueError, match="op_timeout must be a number of seconds >= 0"):
            ddtk.launch(_survivor_writes_error, 1, op_timeout=bad)


def _op_timeout(ctx):
    return ctx.op_timeout


def test_launch_has_an_op_timeout_by_default_and_zero_turns_it_off(monkeypatch) -> None:
    monkeypatch.delenv("DDTK_OP_TIMEOUT", raising=False)
    assert ddtk.launch(_op_timeout, 2, echo=False) == [DEFAULT_OP_TIMEOUT] * 2
    assert ddtk.launch(_op_timeout, 2, echo=False, op_timeout=0) == [None, None]
    monkeypatch.setenv("DDTK_OP_TIMEOUT", "off")
    assert ddtk.launch(_op_timeout, 1, echo=False) == [None]
    assert ddtk.launch(_op_timeout, 1, echo=False, op_timeout=12) == [12.0]
