"""Preemption (:mod:`ddtk.faults.preemption`, :mod:`ddtk.recovery.preemptible`): real ranks, real signals.

A notice (SIGTERM or SIGUSR1) sent to one rank or to all of them, at a step, before
the first step, or in the middle of a checkpoint write; a grace period that the
commit fits in, and one it does not (SIGKILL mid-write). Every run is a
``ddtk.launch`` job whose pids the ranks report; :class:`Preemptor` plays the
scheduler. The ``no_leftover_processes`` fixture checks that no rank outlives a test.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import notice_targets
import pytest

import ddtk
import ddtk.checkpoint as ckpt
from ddtk.faults.preemption import (
    NoticeTarget,
    PreemptionHandler,
    Preemptor,
    agree_to_stop,
    handles,
    pid_of,
    signal_from_name,
    wait_for,
    zombie_status,
)
from ddtk.recovery.common import fingerprint, reference
from ddtk.recovery.preemptible import train

pytestmark = pytest.mark.distributed
GRACE_S = 20.0  # generous: a loaded 2-core CI machine; the commit here takes milliseconds


def _job(world: int, run_dir: Path, steps: int, *, sig: str | None = None, targets: str = "all",
         when: tuple[str, int] = ("step", 4), grace_s: float = GRACE_S, rank_fn: Any = train,
         **kwargs: Any) -> tuple[list[dict] | Exception, Any]:  # fmt: skip
    """Run ``rank_fn`` on ``world`` ranks; send ``sig`` to ``targets`` when rank 0 reports
    the event ``when``; return (the ranks' results or the launch error, the notice's outcome)."""
    pids: dict[int, int] = {}
    notice = Preemptor(grace_s, sig or "SIGTERM")

    def on_report(rank: int, value: dict) -> None:
        pids[rank] = value["pid"]
        if sig and rank == 0 and (value["event"], value["step"]) == when and not notice.started:
            notice.start(sorted(pids.values()) if targets == "all" else [pids[world - 1]])

    try:
        results: Any = ddtk.launch(rank_fn, world, args=(str(run_dir), steps), kwargs=kwargs,
                                   echo=False, timeout=90, on_report=on_report)  # fmt: skip
    except ddtk.RankError as exc:
        results = exc
    return results, notice.result(timeout=30) if notice.started else None


def _committed(run_dir: Path) -> list[int]:
    """Steps of the committed, verified checkpoints in ``run_dir``."""
    return [step for step, path in ckpt.checkpoint_dirs(run_dir) if not ckpt.problems(path)]


@pytest.mark.parametrize(
    ("world", "sig", "targets"), [(2, "SIGTERM", "one"), (3, "SIGUSR1", "all")]
)
def test_a_notice_mid_training_commits_one_checkpoint_at_the_step_every_rank_agreed_on(
    tmp_path: Path, world: int, sig: str, targets: str
) -> None:
    results, outcome = _job(world, tmp_path, 10_000, sig=sig, targets=targets, every=0,
                            step_sleep=0.002)  # fmt: skip
    assert isinstance(results, list), results
    assert outcome.within_grace and not outcome.killed, outcome
    assert set(outcome.exit_codes.values()) == {0}, outcome  # each rank exited with status 0
    stops = {r["stop"] for r in results}
    assert len(stops) == 1 and all(r["preempted"] for r in results), results
    (stop,) = stops
    assert 4 <= stop < 10_000
    assert _committed(tmp_path) == [stop]  # exactly one checkpoint: the agreed step's
    assert [p.name for p in tmp_path.iterdir()] == [f"step-{stop:06d}"]  # nothing half-written
    got = {r["rank"]: r["timeline"]["signal"] for r in results}
    assert got == {r: sig if targets == "all" or r == world - 1 else None for r in range(world)}
    for r in results:
        t = r["timeline"]
        assert outcome.sent_at <= t["boundary"] <= t["committed"] <= t["exit"]
        assert t["exit"] - outcome.sent_at < GRACE_S
    assert len({r["fingerprint"] for r in results}) == 1
    if world == 2:  # a restart resumes at the agreed step and goes on to the end
        again, _ = _job(world, tmp_path, stop + 2, every=0)
        assert [(r["start"], r["stop"], r["preempted"]) for r in again] == [
            (stop, stop + 2, False)
        ] * 2
        # a sum of two halves is exact: the interrupted run ends bitwise where one never
        # interrupted does
        assert again[0]["fingerprint"] == fingerprint(reference(stop + 2, 2, batch_size=24))


def test_a_notice_before_the_first_step_commits_that_step_and_nothing_twice(tmp_path: Path) -> None:
    results, _ = _job(2, tmp_path, 8, notice_at=(0, 0, "SIGTERM"), every=0)
    assert [(r["start"], r["stop"], r["preempted"]) for r in results] == [(0, 0, True)] * 2
    assert _committed(tmp_path) == [0]
    # the restart gets a notice before its first step too: step 0 is already committed,
    # so it stops there and writes nothing again
    manifest = tmp_path / "step-000000" / ckpt.MANIFEST_NAME
    written = manifest.stat().st_mtime_ns
    results, _ = _job(2, tmp_path, 8, notice_at=(1, 0, "SIGUSR1"), every=0)
    assert [(r["start"], r["stop"], r["timeline"]["signal"]) for r in results] == [
        (0, 0, None), (0, 0, "SIGUSR1")]  # fmt: skip
    assert _committed(tmp_path) == [0] and manifest.stat().st_mtime_ns == written


def _signal_inside_save(ctx: Any, run_dir: str, steps: int, **kwargs: Any) -> dict:
    """``train``, with rank 0 sending itself SIGTERM from inside the checkpoint write of step 4."""
    import ddtk.checkpoint.store as store

    original = store.atomic_torch_save

    def save(obj: Any, path: Any, **kw: Any) -> Any:
        if "step-000004" in str(path):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, mid-save
        return original(obj, path, **kw)

    if ctx.rank == 0:
        store.atomic_torch_save = save
    return train(ctx, run_dir, steps, **kwargs)


def _slow_preemption_save(ctx: Any, run_dir: str, steps: int, **kwargs: Any) -> dict:
    """``train``, with a checkpoint write that stalls (slow storage) once a notice arrived."""
    import ddtk.checkpoint.atomic as atomic

    original = atomic.torch.save

    def save(obj: Any, f: Any, *a: Any, **kw: Any) -> None:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL and _noticed():
            f.write(b"\0" * 4096)  # part of the file is written, then the storage stalls
            time.sleep(60)
        original(obj, f, *a, **kw)

    atomic.torch.save = save
    return train(ctx, run_dir, steps, **kwargs)


def _noticed() -> bool:
    """Whether this rank's PreemptionHandler has recorded a notice (read from its handler)."""
    handler = signal.getsignal(signal.SIGTERM)
    owner = getattr(handler, "__self__", None)
    return isinstance(owner, PreemptionHandler) and owner.requested


def test_a_notice_during_a_checkpoint_write_lets_the_write_finish(tmp_path: Path) -> None:
    results, _ = _job(2, tmp_path, 10_000, rank_fn=_signal_inside_save, every=2)
    assert isinstance(results, list), results
    # the flag-only handler did not interrupt the write: step 4 is committed, and the
    # ranks stopped at the boundary right after it without committing it twice
    assert [(r["stop"], r["timeline"]["signal"]) for r in results] == [(4, "SIGTERM"), (4, None)]
    assert _committed(tmp_path) == [2, 4]
    assert not [p for p in tmp_path.rglob("*") if ckpt.atomic.is_temp_name(p.name)]


def test_sigkill_after_the_grace_period_leaves_the_previous_checkpoint_intact(
    tmp_path: Path,
) -> None:
    # 0.1 s steps: the notice (after step 5) lands long before the next periodic commit (8)
    results, outcome = _job(2, tmp_path, 10_000, sig="SIGTERM", when=("step", 5), grace_s=0.5,
                            rank_fn=_slow_preemption_save, every=4, step_sleep=0.1)  # fmt: skip
    assert isinstance(results, ddtk.RankError) and "SIGKILL" in str(results), results
    assert outcome.killed and not outcome.within_grace, outcome
    assert set(outcome.exit_codes.values()) <= {-signal.SIGKILL, 0, None}, outcome
    (torn,) = [p for s, p in ckpt.checkpoint_dirs(tmp_path) if s > 4]
    assert not (torn / ckpt.MANIFEST_NAME).exists()  # never committed: nothing half-visible
    assert ckpt.latest(tmp_path).name == "step-000004" and _committed(tmp_path) == [4]
    assert ckpt.load(tmp_path).step == 4  # a restart resumes from the intact one


def test_the_handler_only_records_and_restores_what_was_there(monkeypatch) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionHandler(["TERM", signal.SIGUSR1]) as notice:
        assert not notice.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # only the first notice is recorded
        assert (notice.signal_name, notice.requested) == ("SIGUSR1", True)
    assert signal.getsignal(signal.SIGUSR1) is before


def test_bad_input_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown signal 'SIGNOPE'"):
        signal_from_name("SIGNOPE")
    with pytest.raises(ValueError, match="grace_s must be"):
        Preemptor(-1)
    with pytest.raises(ValueError, match="at least one pid"):
        Preemptor(1).deliver([])
    with pytest.raises(ValueError, match="at least one signal"):
        PreemptionHandler([])
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _install_in(errors))
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])
    with pytest.raises(ddtk.RankError, match="batch_size 24 is not divisible by 5 ranks"):
        ddtk.launch(train, 5, args=(str(tmp_path), 3), echo=False, timeout=60)


def _install_in(errors: list[BaseException]) -> None:
    try:
        PreemptionHandler().install()
    except ValueError as exc:
        errors.append(exc)


def test_agree_to_stop_is_true_on_every_rank_when_one_rank_has_the_flag() -> None:
    def rank(ctx: Any) -> list[bool]:
        return [agree_to_stop(ctx, ctx.rank == 2), agree_to_stop(ctx, False)]

    assert ddtk.launch(rank, 3, echo=False, timeout=60) == [[True, False]] * 3


def test_a_process_it_did_not_launch_is_found_signalled_and_read_from_outside(
    tmp_path: Path,
) -> None:
    with NoticeTarget(
        notice_targets.commit_on_notice, (str(tmp_path),), tmp_path, tag="commit"
    ) as target:
        target.wait_ready()
        pid = pid_of(target.token)
        assert pid == target.pid and pid_of("ddtk-nobody") is None  # found by its command line
        wait_for(lambda: handles(pid, "SIGUSR1"), 30, "the SIGUSR1 handler")
        assert not handles(pid, signal.SIGTERM)
        out = Preemptor(GRACE_S, "SIGUSR1").deliver(
            [pid], committed=lambda: (tmp_path / "commit").exists()
        )
        assert out.within_grace and out.exit_codes == {pid: 0}, out  # read from the zombie
        assert out.sent_at <= out.committed_at <= out.exited_at[pid]
        assert 0 <= out.seconds_to_commit < GRACE_S
        assert target.close() == 0 and zombie_status(pid) is None  # reaped: no zombie left
    # forked from this process: found by its name, no interpreter to start
    with NoticeTarget(
        notice_targets.no_handler, (str(tmp_path),), tmp_path, tag="plain", fork=True
    ) as target:
        target.wait_ready(timeout=10)
        assert pid_of(target.token) == target.pid != os.getpid()
        assert Path(f"/proc/{target.pid}/comm").read_text().strip() == target.token
        out = Preemptor(GRACE_S, "SIGTERM").deliver([target.pid], committed=lambda: False)
        assert out.exit_codes == {target.pid: -signal.SIGTERM} and out.committed_at is None
        assert out.within_grace  # it ended at once: the default action of SIGTERM
        assert target.close() == -signal.SIGTERM
    with NoticeTarget(sys.exit, (3,), tmp_path, tag="exits", fork=True) as target:
        wait_for(lambda: target.poll() is not None, 10, "the exit")
        assert target.returncode == 3 and target.ready.exists()
    with pytest.raises(TypeError, match="needs a function"):
        NoticeTarget("not a function", (), tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError, match=r"the flag: not within 0\.05 s"):
        wait_for(lambda: False, 0.05, "the flag")
