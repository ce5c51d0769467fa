"""Asynchronous checkpoints: same bytes as a synchronous save, one write in flight, errors
surfaced at the next call, no thread left behind, and a SIGKILL mid-write loses nothing committed."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from ddtk.checkpoint import (
    MANIFEST_NAME,
    CheckpointError,
    CheckpointWriteError,
    capture,
    latest,
    load,
    save,
    step_dir,
    verify,
)
from ddtk.checkpoint import store as store_module
from ddtk.checkpoint.background import AsyncCheckpointer, snapshot

REPO = Path(__file__).resolve().parents[1]


def _model_and_opt(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt


def _flat(obj, key: str = "") -> list:
    """Every leaf of a nested state with its path, in order, for exact comparison."""
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _flat(v, f"{key}/{k}")]
    if isinstance(obj, list | tuple):
        return [x for i, v in enumerate(obj) for x in _flat(v, f"{key}/{i}")]
    return [(key, obj)]


def _assert_same_state(a, b) -> None:
    fa, fb = _flat(a), _flat(b)
    assert [k for k, _ in fa] == [k for k, _ in fb]
    for (key, va), (_, vb) in zip(fa, fb, strict=True):
        if isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and torch.equal(va, vb), key
        else:
            assert va == vb, key


def test_async_save_loads_bitwise_like_sync(tmp_path) -> None:
    model, opt = _model_and_opt()
    state = capture(model, opt, step=3, epoch=1)
    save(tmp_path / "sync", state, 3)
    with AsyncCheckpointer(tmp_path / "async") as ckpt:
        ckpt.save(state, 3)
        path = ckpt.wait()
    assert path == step_dir(tmp_path / "async", 3) and verify(path) == []
    a = load(tmp_path / "sync").state
    b = load(tmp_path / "async").state
    _assert_same_state(a.tensors, b.tensors)
    assert a.meta == b.meta
    # the snapshot is a copy: training on after save() does not change what is written
    assert ckpt.stats.saves == 1 and ckpt.stats.write_s > 0 and ckpt.stats.snapshot_s >= 0


def test_snapshot_copies_and_training_may_go_on(tmp_path) -> None:
    model, _ = _model_and_opt()
    live = {"model": model.state_dict()}  # shares storage with the model
    copy = snapshot(live)
    before = copy["model"]["0.weight"].clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert torch.equal(copy["model"]["0.weight"], before)
    assert not torch.equal(model[0].weight, before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_state_is_snapshotted_into_pinned_buffers(tmp_path) -> None:
    model = nn.Linear(64, 64).cuda()
    reference = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    with AsyncCheckpointer(tmp_path) as ckpt:
        ckpt.save(capture(model, step=1, rng=False), 1)
        with torch.no_grad():
            model.weight.add_(1.0)  # training goes on while the snapshot is written
        path = ckpt.wait()
        pinned = list(ckpt._pinned.values())
    assert pinned and all(t.is_pinned() for t in pinned)
    saved = load(path).state.tensors["model"]
    for k, v in reference.items():
        assert saved[k].device.type == "cpu" and torch.equal(saved[k], v), k


def test_at_most_one_write_in_flight(tmp_path) -> None:
    started, release = threading.Event(), threading.Event()
    active, peak = [0], [0]
    lock = threading.Lock()

    def slow_writer(directory, state, step, **kw):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        started.set()
        release.wait(10)
        try:
            return save(directory, state, step, **kw)
        finally:
            with lock:
                active[0] -= 1

    model, _ = _model_and_opt()
    ckpt = AsyncCheckpointer(tmp_path, writer=slow_writer)
    ckpt.save(capture(model, step=1), 1)
    assert started.wait(10) and ckpt.in_flight
    done = threading.Event()

    def second() -> None:
        ckpt.save(capture(model, step=2), 2)
        done.set()

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.3)
    assert not done.is_set(), "the second save must wait for the first write"
    release.set()
    t.join(10)
    assert done.is_set()
    assert ckpt.stats.stall_s > 0.2  # it waited about 0.3 s for the first write
    assert ckpt.wait() == step_dir(tmp_path, 2)
    ckpt.close()
    assert peak[0] == 1
    assert latest(tmp_path) == step_dir(tmp_path, 2)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_background_error_surfaces_at_next_save(tmp_path, monkeypatch, code) -> None:
    model, _ = _model_and_opt()
    ckpt = AsyncCheckpointer(tmp_path)
    ckpt.save(capture(model, step=1), 1)
    assert ckpt.wait() == step_dir(tmp_path, 1)

    real_write = os.write

    def failing_write(fd, data):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", failing_write)
    ckpt.save(capture(model, step=2), 2)  # returns at once; the write fails in the background
    while ckpt.in_flight:
        time.sleep(0.01)
    monkeypatch.setattr(os, "write", real_write)
    with pytest.raises(CheckpointError, match="background checkpoint of step 2") as info:
        ckpt.save(capture(model, step=3), 3)
    assert isinstance(info.value.__cause__, CheckpointWriteError)
    assert info.value.__cause__.errno == code
    # the failed step left nothing committed; the error was raised once; saving goes on
    assert latest(tmp_path) == step_dir(tmp_path, 1)
    assert not step_dir(tmp_path, 2).exists()
    ckpt.save(capture(model, step=3), 3)
    ckpt.close()
    assert latest(tmp_path) == step_dir(tmp_path, 3)


def test_error_surfaces_at_wait_and_close(tmp_path) -> None:
    def broken(directory, state, step, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    model, _ = _model_and_opt()
    ckpt = AsyncCheckpointer(tmp_path, writer=broken)
    ckpt.save(capture(model, step=5), 5)
    with pytest.raises(CheckpointError, match=r"step 5.*No space left") as info:
        ckpt.wait()
    assert isinstance(info.value.__cause__, OSError)
    ckpt.save(capture(model, step=6), 6)
    with pytest.raises(CheckpointError, match="step 6"):
        ckpt.close()
    with pytest.raises(CheckpointError, match="closed"):
        ckpt.save(capture(model, step=7), 7)


def test_no_thread_left_after_close(tmp_path) -> None:
    before = set(threading.enumerate())
    model, _ = _model_and_opt()
    with AsyncCheckpointer(tmp_path, keep_last=2) as ckpt:
        for step in range(1, 5):
            ckpt.save(capture(model, step=step), step)
    assert set(threading.enumerate()) == before
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["step-000003", "step-000004"]
    assert not ckpt.in_flight


def test_bad_arguments(tmp_path) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        AsyncCheckpointer(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="world_size"):
        AsyncCheckpointer(tmp_path, world_size=0)
    with pytest.raises(TypeError, match="writer"):
        AsyncCheckpointer(tmp_path, writer=3)
    ckpt = AsyncCheckpointer(tmp_path)
    with pytest.raises(TypeError, match="CheckpointState"):
        ckpt.save({"model": {}}, 1)
    with pytest.raises(ValueError, match="step"):
        ckpt.save(capture(nn.Linear(1, 1), step=0), -1)
    ckpt.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux-only")
def test_writer_thread_runs_at_lower_priority(tmp_path) -> None:
    seen = []

    def spy(directory, state, step, **kw):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return save(directory, state, step, **kw)

    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with AsyncCheckpointer(tmp_path, writer=spy) as ckpt:
        ckpt.save(capture(nn.Linear(2, 2), step=1), 1)
    with AsyncCheckpointer(tmp_path, writer=spy, writer_nice=None) as ckpt:
        ckpt.save(capture(nn.Linear(2, 2), step=2), 2)
    assert seen == [max(10, own), own]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
    with pytest.raises(ValueError, match="writer_nice"):
        AsyncCheckpointer(tmp_path, writer_nice=25)


_KILL_CHILD = """
import sys, time, torch
from ddtk.checkpoint import capture, save
from ddtk.checkpoint import atomic
from ddtk.checkpoint.background import AsyncCheckpointer
run = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Linear(512, 512)
ckpt = AsyncCheckpointer(run)
ckpt.save(capture(model, step=1, rng=False), 1)
ckpt.wait()
real = atomic._write_all
def say(word):  # one write per line: print() writes the newline separately, and two
    sys.stdout.write(word + "\\n")  # threads printing at once could interleave their words
    sys.stdout.flush()
def slow(fd, data):
    say("writing")
    time.sleep(60)
    real(fd, data)
atomic._write_all = slow
with torch.no_grad():
    model.weight.add_(1.0)
ckpt.save(capture(model, step=2, rng=False), 2)
say("saved")
time.sleep(60)
"""


def test_sigkill_during_background_write_keeps_previous_latest(tmp_path) -> None:
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_CHILD, str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        lines = []
        deadline = time.monotonic() + 120
        while len(lines) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        assert sorted(lines) == ["saved", "writing"], proc.stderr.read() if proc.poll() else lines
        assert step_dir(run, 2).is_dir()  # the background write had started
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (step_dir(run, 2) / MANIFEST_NAME).exists()
    assert latest(run) == step_dir(run, 1)
    model = nn.Linear(512, 512)
    with pytest.warns(RuntimeWarning, match="step-000002"):
        assert load(run, model, rng=False).step == 1
    torch.manual_seed(0)
    assert torch.equal(model.weight, nn.Linear(512, 512).weight)


def test_writer_is_looked_up_at_write_time(tmp_path, monkeypatch) -> None:
    calls = []
    real = store_module.save

    def spy(*args, **kw):
        calls.append(args[2])
        return real(*args, **kw)

    monkeypatch.setattr(store_module, "save", spy)
    with AsyncCheckpointer(tmp_path) as ckpt:
        ckpt.save(capture(nn.Linear(2, 2), step=4), 4)
    assert calls == [4]


def test_bench_checkpoint_tiny_run_writes_json_and_png(tmp_path, capsys) -> None:
    import argparse
    import json
    import math

    from ddtk.bench import checkpoint as bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    out_json, out_png = tmp_path / "ckpt.json", tmp_path / "ckpt.png"
    args = parser.parse_args(["checkpoint", "--size-mb", "0.5", "--repeats", "1", "--every", "2",
                              "--steps", "6", "--rounds", "1", "--dir", str(tmp_path / "work"),
                              "--json", str(out_json), "--plot", str(out_png)])  # fmt: skip
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "async write" in printed and "target <= 5%" in printed
    assert printed.count("x DCP's") == 2 and "target <= 1.0x" in printed  # save and load
    rows = json.loads(out_json.read_text())["rows"]
    ops = {(r["tool"], r["op"]) for r in rows}
    for tool in ("ddtk", "dcp"):
        for op in ("save", "load", "async stall", "async write"):
            assert (tool, op) in ops
    for r in rows:
        assert math.isfinite(r["seconds"]) and r["seconds"] > 0, r
    by = {r["op"]: r for r in rows if r["tool"] == "ddtk"}
    # the second incremental save changed one layer of four: it writes less than a quarter
    assert by["incremental second"]["bytes"] < by["incremental first"]["bytes"] / 4
    assert by["incremental second"]["blobs_written"] == 1
    assert by["loop sync"]["checkpoints"] == by["loop async"]["checkpoints"] == 2
    assert out_png.stat().st_size > 0 and out_png.read_bytes()[:4] == b"\x89PNG"
    assert list((tmp_path / "work").iterdir()) == []  # the bench cleans up after itself


def test_paired_overhead_counts_stalls_and_contention_against_idle_steps() -> None:
    """Worked by hand: idle steps take 1 s, one step overlapping a write takes 2 s, 0.5 s blocked."""
    from ddtk.bench.checkpoint import _paired_overhead

    run = {"step_s": [1.0, 1.0, 1.0, 2.0, 1.0], "busy": [False, False, False, True, False],
           "stall_s": [0.5, 0.0]}  # fmt: skip
    overhead, stall, contention = _paired_overhead(run)
    assert (overhead, stall, contention) == pytest.approx((30.0, 10.0, 20.0))
    # a loop without checkpoints has none of either
    assert _paired_overhead({"step_s": [1.0, 1.2], "busy": [False, False], "stall_s": [0.0]}) == (
        pytest.approx(0.0),
        0.0,
        0.0,
    )
