"""Checkpoints: atomic writes under SIGKILL and full disks, verification and fallback,
weights-only loading, clear mismatch errors, retention, and bitwise-identical resume."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddtk.checkpoint import (
    MANIFEST_NAME,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    CorruptCheckpointError,
    ResumableSampler,
    UnsafeCheckpointError,
    apply_retention,
    atomic_write_bytes,
    capture,
    capture_rng,
    checkpoint_dirs,
    latest,
    load,
    plan_retention,
    restore_rng,
    save,
    step_dir,
    verify,
    write_manifest,
)
from ddtk.checkpoint import atomic as atomic_mod
from ddtk.checkpoint.atomic import is_temp_name
from ddtk.checkpoint.manifest import describe_file
from ddtk.checkpoint.store import STATE_FILE

TESTS = Path(__file__).resolve().parent


# ---------------------------------------------------------------- helpers


def _child(code: str, *args: str) -> subprocess.Popen:
    """A fresh Python process running ``code`` with this test module importable."""
    prog = f"import sys; sys.path.insert(0, {str(TESTS)!r}); {code}"
    return subprocess.Popen(
        [sys.executable, "-c", prog, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err}"
    return out


def _temp_files(root: Path) -> list[str]:
    return [n for _d, _s, files in os.walk(root) for n in files if is_temp_name(n)]


def _linear_run(run: Path, steps: list[int], seed: int = 0) -> dict[int, torch.Tensor]:
    """Save a Linear(3, 2) with different weights at each step; returns the weights saved."""
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    saved = {}
    for s in steps:
        with torch.no_grad():
            model.weight.add_(1.0)
        saved[s] = model.weight.detach().clone()
        save(run, capture(model, step=s, rng=False), s)
    return saved


# ---------------------------------------------------------------- training used by resume tests

TOTAL, BATCH, SAVE_EVERY = 90, 32, 10


def _train_main(argv: list[str]) -> None:
    """Train digits with SGD+momentum, StepLR, dropout, noise and flips; resume from ``run``.

    argv: data file, run directory (``-`` for none), total steps, stop step (-1: none),
    seconds of sleep per step, output file for the final flat parameters, ``rng``/``norng``.
    """
    data_file, run, total, stop_at, delay, out, rng = argv
    total, stop_at, delay = int(total), int(stop_at), float(delay)
    torch.set_num_threads(1)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    x_all, y_all = torch.load(data_file, weights_only=True)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=25, gamma=0.5)
    sampler = ResumableSampler(len(y_all), seed=3)
    step = 0
    if run != "-" and latest(run) is not None:
        step = load(run, model, opt, sched, sampler, rng=rng == "rng").step
    print(f"start {step}", flush=True)
    while step < total:
        idx = sampler.next_batch(BATCH)
        x, y = x_all[idx], y_all[idx]
        x = x + torch.from_numpy(np.random.normal(0.0, 0.05, size=tuple(x.shape))).float()
        if random.random() < 0.5:
            x = x.flip(-1)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if run != "-" and (step % SAVE_EVERY == 0 or step == stop_at):
            state = capture(model, opt, sched, sampler, step=step, epoch=sampler.epoch)
            save(run, state, step, keep_last=3)
        if step == stop_at:
            return
        time.sleep(delay)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    torch.save(flat, out)


_DATA: list[Path] = []  # the digits as a .pt, so the children need not import scikit-learn


def _train(run: str, out: Path, stop_at: int = -1, delay: float = 0.0, rng: str = "rng"):
    code = "import test_checkpoint as t; t._train_main(sys.argv[1:])"
    args = (str(_DATA[0]), run, str(TOTAL), str(stop_at), str(delay), str(out), rng)
    return _child(code, *args)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> torch.Tensor:
    """Final parameters of a run never interrupted (and never checkpointed)."""
    from ddtk.data import load_dataset

    root = tmp_path_factory.mktemp("ref")
    data = load_dataset("digits")
    torch.save((data.x, data.y), root / "digits.pt")
    _DATA[:] = [root / "digits.pt"]
    _finish(_train("-", root / "final.pt"))
    return torch.load(root / "final.pt", weights_only=True)


# ---------------------------------------------------------------- atomic writes


def _big_save_main(argv: list[str]) -> None:
    """Save a large checkpoint at step 2 (the parent kills this process meanwhile)."""
    run = argv[0]
    model = nn.Linear(4096, 8192)  # 32 M floats: 128 MiB
    print("ready", flush=True)
    save(run, capture(model, step=2, rng=False), 2)


def test_sigkill_during_write_keeps_previous_checkpoint(tmp_path) -> None:
    run = tmp_path / "run"
    saved = _linear_run(run, [1])
    proc = _child("import test_checkpoint as t; t._big_save_main(sys.argv[1:])", str(run))
    target = step_dir(run, 2)
    seen_temp = None
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            temps = [n for n in os.listdir(target) if is_temp_name(n)] if target.is_dir() else []
            if temps:
                seen_temp = temps[0]
                break
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert seen_temp is not None, "the child never started writing"
    assert proc.returncode == -signal.SIGKILL
    assert not (target / MANIFEST_NAME).exists()
    assert verify(step_dir(run, 1)) == []
    assert latest(run) == step_dir(run, 1)
    model = nn.Linear(3, 2)
    with pytest.warns(RuntimeWarning, match="step-000002: manifest.json is missing"):
        assert load(run, model).step == 1
    assert torch.equal(model.weight, saved[1])
    # the next save of step 2 replaces the leftover, and retention cleans what is stale
    save(run, capture(model, step=2, rng=False), 2)
    assert latest(run) == target and _temp_files(run) == []


def test_atomic_write_replaces_or_keeps_old_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "f.bin"
    info = atomic_write_bytes(path, b"old contents")
    assert info == describe_file(path)

    def disk_full(fd, data):
        os.write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_mod, "_write_all", disk_full)
    with pytest.raises(CheckpointWriteError) as err:
        atomic_write_bytes(path, b"new contents that do not fit")
    assert err.value.errno == errno.ENOSPC and isinstance(err.value, OSError)
    assert str(path) in str(err.value) and "No space left on device" in str(err.value)
    assert path.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["f.bin"]


@pytest.mark.parametrize(
    "code, hook",
    [(errno.ENOSPC, "_write_all"), (errno.EACCES, "_open_temp")],
    ids=["ENOSPC-on-write", "EACCES-on-open"],
)
def test_injected_write_errors_leave_previous_checkpoint(tmp_path, monkeypatch, code, hook) -> None:
    # root ignores file modes, so permission denied is injected like a full disk
    run = tmp_path / "run"
    saved = _linear_run(run, [1])

    def fail(*args):
        if hook == "_write_all":
            os.write(args[0], b"partial")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic_mod, hook, fail)
    model = nn.Linear(3, 2)
    with pytest.raises(CheckpointWriteError) as err:
        save(run, capture(model, step=2), 2)
    assert err.value.errno == code and os.strerror(code) in str(err.value)
    assert str(step_dir(run, 2) / STATE_FILE) in str(err.value)
    monkeypatch.undo()
    assert _temp_files(run) == [] and not step_dir(run, 2).exists()
    assert latest(run) == step_dir(run, 1)
    load(run, model)
    assert torch.equal(model.weight, saved[1])


def test_real_full_disk_on_a_small_tmpfs(tmp_path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        saved = _linear_run(mnt, [1])
        big = nn.Linear(512, 1024)  # 2 MiB of weights on a 1 MiB file system
        with pytest.raises(CheckpointWriteError) as err:
            save(mnt, capture(big, step=2, rng=False), 2)
        assert err.value.errno == errno.ENOSPC
        assert _temp_files(mnt) == [] and not step_dir(mnt, 2).exists()
        model = nn.Linear(3, 2)
        assert load(mnt, model).step == 1 and torch.equal(model.weight, saved[1])
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# ---------------------------------------------------------------- verification and fallback


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "no-manifest", "bad-manifest", "missing"])
def test_corrupt_newest_warns_and_falls_back(tmp_path, damage) -> None:
    run = tmp_path / "run"
    saved = _linear_run(run, [1, 2, 3])
    newest = step_dir(run, 3)
    state = newest / STATE_FILE
    if damage == "flip":
        _flip_byte(state)
        why = "sha256"
    elif damage == "truncate":
        os.truncate(state, state.stat().st_size - 10)
        why = "bytes"
    elif damage == "no-manifest":
        (newest / MANIFEST_NAME).unlink()
        why = "never committed"
    elif damage == "bad-manifest":
        (newest / MANIFEST_NAME).write_text("{not json")
        why = "unreadable"
    else:
        state.unlink()
        why = "missing"
    assert verify(newest) != [] and verify(step_dir(run, 2)) == []
    assert latest(run) == step_dir(run, 2)
    model = nn.Linear(3, 2)
    with pytest.warns(RuntimeWarning, match=rf"step-000003.*{why}"):
        ckpt = load(run, model)
    assert ckpt.step == 2 and ckpt.path == step_dir(run, 2)
    assert torch.equal(model.weight, saved[2])
    with pytest.raises(CorruptCheckpointError, match="step-000003"):
        load(newest, model)


def test_no_good_checkpoint_is_a_clear_error(tmp_path) -> None:
    run = tmp_path / "run"
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint directory"):
        load(run)
    run.mkdir()
    with pytest.raises(CheckpointNotFoundError, match="no step-N directories"):
        load(run)
    _linear_run(run, [1, 2])
    for _s, path in checkpoint_dirs(run):
        _flip_byte(path / STATE_FILE)
    assert latest(run) is None
    with (
        pytest.warns(RuntimeWarning),
        pytest.raises(CheckpointNotFoundError, match=r"step-000002 .*sha256.*step-000001"),
    ):
        load(run)


class _Evil:
    """Unpickling this runs a shell command that creates a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused(tmp_path) -> None:
    run = tmp_path / "run"
    _linear_run(run, [1])
    marker = tmp_path / "pwned"
    path = step_dir(run, 2)
    path.mkdir()
    torch.save({"model": {}, "payload": _Evil(marker)}, path / STATE_FILE)
    (path / "meta.json").write_text(json.dumps({"step": 2}))
    files = {n: describe_file(path / n) for n in (STATE_FILE, "meta.json")}
    write_manifest(path, files, step=2)
    assert verify(path) == []  # the checksums are right: only the content is hostile
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*state\.pt"):
        load(run, nn.Linear(3, 2))
    assert not marker.exists()
    # the payload is live: an unrestricted unpickler would have run it
    torch.load(path / STATE_FILE, weights_only=False)
    assert marker.exists()


def test_wrong_model_names_keys_and_shapes(tmp_path) -> None:
    run = tmp_path / "run"
    _linear_run(run, [1])
    wider = nn.Linear(3, 4)
    before = wider.weight.detach().clone()
    with pytest.raises(CheckpointMismatchError) as err:
        load(run, wider)
    msg = str(err.value)
    assert (
        "weight: checkpoint (2, 3) vs model (4, 3)" in msg
        and "bias: checkpoint (2,) vs model (4,)" in msg
    )
    assert torch.equal(wider.weight, before)  # nothing changed
    with pytest.raises(CheckpointMismatchError) as err:
        load(run, nn.Sequential(nn.Linear(3, 2)))
    msg = str(err.value)
    assert "missing from the checkpoint: 0.bias, 0.weight" in msg
    assert "not in the model: bias, weight" in msg
    with pytest.raises(CheckpointMismatchError, match="no optimizer state"):
        m = nn.Linear(3, 2)
        load(run, m, torch.optim.SGD(m.parameters(), lr=0.1))


def test_bad_arguments(tmp_path) -> None:
    with pytest.raises(TypeError, match="CheckpointState"):
        save(tmp_path, {"model": {}}, 1)
    with pytest.raises(ValueError, match="step"):
        capture(nn.Linear(1, 1), step=-1)
    with pytest.raises(ValueError, match="keep_last"):
        save(tmp_path, capture(nn.Linear(1, 1), step=1), 1, keep_last=0)
    with pytest.raises(ValueError, match="n must be"):
        ResumableSampler(0)
    save(tmp_path, capture(nn.Linear(1, 1), step=1), 1)
    with pytest.raises(Exception, match="already exists"):
        save(tmp_path, capture(nn.Linear(1, 1), step=1), 1)


# ---------------------------------------------------------------- state pieces


def test_sampler_resumes_mid_epoch() -> None:
    full = ResumableSampler(10, seed=5)
    reference = [full.next_batch(3).tolist() for _ in range(9)]  # crosses two epochs
    first = sorted(i for batch in reference[:4] for i in batch)
    assert first == list(range(10))  # each epoch is a permutation
    assert reference[:4] != reference[4:8]  # and a different one each epoch
    part = ResumableSampler(10, seed=5)
    got = [part.next_batch(3).tolist() for _ in range(5)]
    state = part.state_dict()
    assert state["epoch"] == 1 and state["position"] == 3
    resumed = ResumableSampler(10, seed=5)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    got += [resumed.next_batch(3).tolist() for _ in range(4)]
    assert got == reference
    with pytest.raises(CheckpointMismatchError, match="seed"):
        ResumableSampler(10, seed=6).load_state_dict(state)


def test_rng_states_round_trip(tmp_path) -> None:
    rng = capture_rng()
    path = tmp_path / "rng.pt"
    torch.save(rng, path)
    expected = (random.random(), np.random.normal(size=3).tolist(), torch.rand(3))
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    restore_rng(torch.load(path, weights_only=True))
    got = (random.random(), np.random.normal(size=3).tolist(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


# ---------------------------------------------------------------- retention


def test_retention_policy(tmp_path) -> None:
    run = tmp_path / "run"
    model = nn.Linear(2, 2)
    for s in (100, 200, 300, 400, 500, 600):
        save(run, capture(model, step=s, rng=False), s, keep_last=2, keep_every=200)
    assert [s for s, _p in checkpoint_dirs(run)] == [200, 400, 500, 600]
    assert plan_retention([3, 1, 2], keep_last=1) == {3}
    assert plan_retention([10, 15, 20], keep_every=10) == {10, 20}
    assert plan_retention([10, 15], keep_every=10) == {10, 15}  # the newest always stays


def test_retention_never_removes_the_only_good_one(tmp_path) -> None:
    run = tmp_path / "run"
    _linear_run(run, [1, 2, 3, 4])
    (step_dir(run, 1) / MANIFEST_NAME).unlink()  # older incomplete: cleaned
    _flip_byte(step_dir(run, 2) / STATE_FILE)  # older corrupt: cleaned
    _flip_byte(step_dir(run, 4) / STATE_FILE)  # newer than the newest good: left alone
    names = lambda paths: sorted(p.name for p in paths)  # noqa: E731
    # a cheap pass sees only completeness: the corrupt step 2 counts as good and is kept
    assert names(apply_retention(run, keep_last=2, dry_run=True, checksums=False)) == [
        "step-000001"
    ]
    assert names(apply_retention(run, keep_last=2, dry_run=True)) == names(
        [step_dir(run, 1), step_dir(run, 2)]
    )
    assert len(checkpoint_dirs(run)) == 4  # dry runs remove nothing
    removed = apply_retention(run, keep_last=1)
    assert names(removed) == ["step-000001", "step-000002"]
    assert [s for s, _p in checkpoint_dirs(run)] == [3, 4]
    assert latest(run) == step_dir(run, 3)
    assert apply_retention(run, keep_last=1) == []
    _flip_byte(step_dir(run, 3) / STATE_FILE)
    assert apply_retention(run, keep_last=1) == []  # no good checkpoint: remove nothing


# ---------------------------------------------------------------- bitwise resume


@pytest.mark.slow
def test_resume_in_a_fresh_process_is_bitwise_identical(tmp_path, reference) -> None:
    run, out = tmp_path / "run", tmp_path / "out.pt"
    _finish(_train(str(run), out, stop_at=37))
    assert latest(run) == step_dir(run, 37) and not out.exists()
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert _finish(_train(str(run), out)).startswith("start 37")
    assert torch.equal(torch.load(out, weights_only=True), reference)
    # control: the same resume without the RNG states does not match
    out2 = tmp_path / "out2.pt"
    _finish(_train(str(copy), out2, rng="norng"))
    assert not torch.equal(torch.load(out2, weights_only=True), reference)


@pytest.mark.slow
def test_resume_after_sigkill_at_a_random_moment_is_bitwise_identical(tmp_path, reference) -> None:
    run, out = tmp_path / "run", tmp_path / "out.pt"
    seed = random.randrange(10**6)
    delay = random.Random(seed).uniform(0.0, 0.2)
    proc = _train(str(run), out, delay=0.01)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if sum((p / MANIFEST_NAME).exists() for _s, p in checkpoint_dirs(run)) >= 2:
                break
            time.sleep(0.005)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        _out, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"seed {seed}: child ended first: {err}"
    assert not out.exists()
    resumed = _finish(_train(str(run), out))
    start = int(resumed.split()[1])
    print(f"seed {seed}: killed {delay:.3f} s after the 2nd checkpoint; resumed from step {start}")
    assert start >= 2 * SAVE_EVERY, f"seed {seed}: resumed from {start}"
    assert torch.equal(torch.load(out, weights_only=True), reference), f"seed {seed}"
