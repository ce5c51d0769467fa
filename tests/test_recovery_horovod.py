"""Horovod Elastic recovery: a worker SIGKILLed mid-run, and a host removed by discovery.

Real ``horovodrun --gloo`` elastic jobs on this machine, with two "hosts"
(``localhost:1`` and ``127.0.0.1:1``, both this machine) listed by
``ddtk/recovery/discover_hosts.sh`` from a file, so the host of a failed worker
can be blacklisted while the survivor's host stays. The world size goes
2 -> 1, so the result is checked against what is guaranteed:

* training completes every step; no committed step is lost;
* after a crash the state is rolled back to the last commit, and only the
  steps since that commit are computed again;
* every step in the final model was applied exactly once: the model equals,
  bit for bit, :func:`ddtk.recovery.common.reference` run with the same per-step
  world-size schedule (sizes 1 and 2 make that exact: halving is exact and a
  sum of two terms does not depend on the order);
* it is close to the fixed-size reference: ``rtol=1e-5, atol=1e-6`` (a full-batch
  mean against the mean of two half-batch means, float32, 40 steps).

Skipped with the reason when Horovod is not importable, unless ``DDTK_REQUIRE``
names ``horovod`` (then they fail).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import torch
from support import outliving

from ddtk.recovery.common import build, fingerprint, reference
from ddtk.recovery.horovod_elastic_train import (
    keep_only_host,
    parse_args,
    read_log,
    schedule_from_log,
)

ROOT = Path(__file__).resolve().parents[1]
DISCOVERY = ROOT / "ddtk" / "recovery" / "discover_hosts.sh"
JOB_TIMEOUT_S = 150
STEPS, EVERY = 40, 10
HOSTS = "localhost:1\n127.0.0.1:1\n"


def _tagged(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("DDTK_TEST_TAG") == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


@pytest.fixture
def elastic_job(horovodrun: Path, tmp_path: Path):
    """Run ``horovod_elastic_train`` under elastic ``horovodrun``; leave no process behind."""
    tag = uuid.uuid4().hex
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    script = tmp_path / "discover_hosts.sh"  # a copy, so its mode is ours to set
    shutil.copy(DISCOVERY, script)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "run"

    def run(*extra: str) -> tuple[Path, str]:
        cmd = [str(horovodrun), "--gloo", "-np", "2", "--min-np", "1", "--max-np", "2"]
        cmd += ["--host-discovery-script", str(script)]
        cmd += [sys.executable, "-m", "ddtk.recovery.horovod_elastic_train", "--dir", str(out)]
        cmd += ["--steps", str(STEPS), "--every", str(EVERY), *extra]
        env = dict(os.environ, DDTK_TEST_TAG=tag, DDTK_HOSTS_FILE=str(hosts), PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        log = tmp_path / "job.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                proc.wait(timeout=JOB_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                pytest.fail(f"horovodrun did not finish in {JOB_TIMEOUT_S} s:\n{log.read_text()}")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        output = log.read_text()
        assert proc.returncode == 0, output[-4000:]
        return out, output

    yield run
    leftovers = outliving(_tagged(tag))
    described = [f"{p.pid}: {' '.join(p.cmdline()[:6])}" for p in leftovers]
    for p in leftovers:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(leftovers, timeout=10)
    assert not leftovers, f"horovodrun left processes behind: {described}"


def _logs(out: Path) -> list[list[tuple[int, int, float]]]:
    """Each worker's step log, the longest (the survivor's) first."""
    return sorted((read_log(p) for p in out.glob("steps-*.log")), key=len, reverse=True)


def _check_model(final: dict, schedule: list[int]) -> None:
    assert final["fingerprint"] == fingerprint(reference(STEPS, 2, world_sizes=schedule))
    # and close to an uninterrupted two-worker run
    initial = torch.cat([p.detach().flatten() for p in build()[0].parameters()])
    fixed = torch.cat([p.detach().flatten() for p in reference(STEPS, 2).parameters()])
    elastic = torch.cat(
        [p.detach().flatten() for p in reference(STEPS, 2, world_sizes=schedule).parameters()]
    )
    torch.testing.assert_close(elastic, fixed, rtol=1e-5, atol=1e-6)
    assert not torch.equal(elastic, initial)  # it trained


def test_schedule_from_log_keeps_the_last_run_of_each_step():
    log = [(0, 2), (1, 2), (2, 2), (3, 2), (2, 1), (3, 1), (4, 1)]  # rolled back to 2
    assert schedule_from_log(log) == [2, 2, 1, 1, 1]
    assert schedule_from_log([(0, 2), (1, 2), (0, 1), (1, 1)]) == [1, 1]
    assert schedule_from_log([]) == []


def test_keep_only_host_rewrites_the_discovery_file(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n\n127.0.0.1:2\nnode7:4\n")
    assert keep_only_host(hosts, "127.0.0.1") == ["localhost:1", "node7:4"]
    assert hosts.read_text() == "127.0.0.1:2\n"


def test_discovery_script_prints_the_hosts_file(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    env = dict(os.environ, DDTK_HOSTS_FILE=str(hosts))
    out = subprocess.run(
        ["sh", str(DISCOVERY)], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and out.stdout == HOSTS
    env.pop("DDTK_HOSTS_FILE")
    out = subprocess.run(
        ["sh", str(DISCOVERY)], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode != 0 and "DDTK_HOSTS_FILE" in out.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps and --every"),
        (["--kill-rank", "1"], "--kill-rank and --kill-step"),
        (["--shrink-at-step", "3"], "--hosts-file and --shrink-at-step"),
    ],
)
def test_parse_args_rejects_bad_combinations(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--dir", "d", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.horovod
@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("kill_rank", [1, 0], ids=["worker", "rank0"])
def test_killed_worker_rolls_back_to_the_commit_and_training_completes(elastic_job, kill_rank):
    """Rank 0 too: the survivor becomes rank 0 and its own copy of the commit is the state."""
    kill_step = 25
    last_commit = kill_step // EVERY * EVERY
    out, output = elastic_job("--kill-rank", str(kill_rank), "--kill-step", str(kill_step))
    assert "exit with status code 137" in output  # SIGKILL, seen by horovodrun
    final = json.loads((out / "final.json").read_text())
    assert final["steps"] == STEPS and final["world_size"] == 1 and final["resets"] == 1

    survivor, killed = _logs(out)
    assert [(s, n) for s, n, _ in killed] == [(s, 2) for s in range(kill_step)]
    expected = [(s, 2) for s in range(kill_step)] + [(s, 1) for s in range(last_commit, STEPS)]
    assert [(s, n) for s, n, _ in survivor] == expected  # rolled back to 20, 20..24 twice
    schedule = [2] * last_commit + [1] * (STEPS - last_commit)
    assert schedule_from_log(survivor) == schedule == final["schedule"]
    _check_model(final, schedule)

    rec = json.loads((out / "recovery.json").read_text())
    assert rec["resumed_step"] == last_commit and rec["recovery_seconds"] > 0
    print(
        f"\nhorovod elastic, rank {kill_rank} SIGKILLed before step {kill_step}: crash -> first step after "
        f"the reset {rec['recovery_seconds']:.2f} s; {kill_step - last_commit} steps recomputed"
    )


@pytest.mark.horovod
@pytest.mark.distributed
@pytest.mark.slow
def test_host_removed_by_discovery_shrinks_the_job_at_a_commit(elastic_job, tmp_path):
    shrink_at = 11
    out, _output = elastic_job(
        "--hosts-file", str(tmp_path / "hosts"), "--shrink-at-step", str(shrink_at),
        "--step-delay", "0.25",
    )  # fmt: skip
    final = json.loads((out / "final.json").read_text())
    assert final["steps"] == STEPS and final["world_size"] == 1 and final["resets"] == 1
    survivor, removed = _logs(out)
    steps = [s for s, _, _ in survivor]
    assert steps == list(range(STEPS))  # nothing rolled back, nothing repeated
    # the change takes effect at a commit after the host was removed
    boundary = len(removed)
    assert boundary % EVERY == 0 and shrink_at < boundary < STEPS
    assert [(s, n) for s, n, _ in removed] == [(s, 2) for s in range(boundary)]
    schedule = [2] * boundary + [1] * (STEPS - boundary)
    assert [n for _, n, _ in survivor] == schedule == final["schedule"]
    _check_model(final, schedule)
    gap = survivor[boundary][2] - survivor[boundary - 1][2] - 0.25
    print(
        f"\nhorovod elastic, host removed at step {shrink_at}: interrupt at the commit of step "
        f"{boundary}; pause for the reset {gap:.2f} s; 0 steps recomputed"
    )
