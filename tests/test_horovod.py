"""Horovod smoke tests: real ``horovodrun -np 2 --gloo`` jobs on this machine.

Horovod is built by ``make horovod`` (``scripts/build_horovod.sh``). When it is not
importable these tests skip with that hint, unless ``DDTK_REQUIRE`` names
``horovod`` (for example ``DDTK_REQUIRE=ray,horovod`` in CI), in which case they fail.

Each job runs in its own session with a unique ``DDTK_TEST_TAG`` in its
environment, so the tests can find every process it started (even workers that
were re-parented after ``horovodrun`` exited) and check that none is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from support import outliving, require_or_skip

pytestmark = pytest.mark.horovod

NP = 2
JOB_TIMEOUT_S = 120
RESULT_RE = re.compile(r"HVDRESULT (\{.*\})")


SMOKE_SCRIPT = textwrap.dedent(
    """
    import json

    import torch
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)

    # All-reduce a rank-dependent tensor: rank r holds [0, 1, 2, 3] + 10 r.
    base = torch.arange(4, dtype=torch.float32)
    local = base + 10 * rank
    total = hvd.allreduce(local, op=hvd.Sum, name="sum")
    mean = hvd.allreduce(local, op=hvd.Average, name="avg")
    offset = 10 * sum(range(size))
    assert torch.equal(total, size * base + offset), total
    assert torch.allclose(mean, base + offset / size), mean

    # Every rank initialises its model from its own seed; rank 0's weights must win.
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    before = [p.detach().flatten().tolist() for p in model.parameters()]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    after = [p.detach().flatten().tolist() for p in model.parameters()]
    torch.manual_seed(0)
    reference = [p.detach().flatten().tolist() for p in torch.nn.Linear(3, 2).parameters()]
    assert after == reference, (after, reference)

    result = {
        "rank": rank, "size": size, "sum": total.tolist(), "avg": mean.tolist(),
        "before": before, "after": after,
    }
    print("HVDRESULT " + json.dumps(result), flush=True)
    hvd.shutdown()
    """
)

FAILING_SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    import torch
    import horovod.torch as hvd

    # Rank 1 dies before the rendezvous, so rank 0 blocks in init() until horovodrun stops it.
    if os.environ["HOROVOD_RANK"] == "1":
        sys.exit(3)
    hvd.init()
    hvd.allreduce(torch.ones(2), name="never_completes")
    """
)


@dataclass
class Job:
    """The outcome of one ``horovodrun`` job."""

    returncode: int
    output: str

    def results(self) -> dict[int, dict]:
        """The ``HVDRESULT`` record each rank printed, keyed by rank."""
        records = [json.loads(m.group(1)) for m in RESULT_RE.finditer(self.output)]
        return {record["rank"]: record for record in records}


def _alive(proc: psutil.Process) -> bool:
    """True while a process runs (a zombie has exited and only waits to be reaped)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tagged_processes(tag: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``DDTK_TEST_TAG=tag``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DDTK_TEST_TAG") == tag and _alive(proc):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _describe(proc: psutil.Process) -> str:
    """``pid: command line`` of a process, for failure messages."""
    try:
        return f"{proc.pid}: {' '.join(proc.cmdline())}"
    except psutil.Error:
        return str(proc.pid)


def _kill(procs: list[psutil.Process]) -> None:
    """Kill processes and reap them."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


@pytest.fixture
def run_job(horovodrun: Path, tmp_path: Path):
    """Return a function that runs a script under ``horovodrun`` and leaves no process behind."""
    tag = uuid.uuid4().hex
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}

    def run(source: str) -> Job:
        script = tmp_path / "job.py"
        script.write_text(source)
        cmd = [str(horovodrun), "-np", str(NP), "--gloo", "-H", f"localhost:{NP}"]
        cmd += [sys.executable, str(script)]
        env = {**os.environ, "DDTK_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"}
        # Output goes to a file, not a pipe: a stray process holding a pipe open would
        # make reading it block past horovodrun's exit and hide the leak as a timeout.
        log = tmp_path / "job.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=JOB_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                _kill(_tagged_processes(tag))
                proc.wait()
                pytest.fail(f"horovodrun did not finish in {JOB_TIMEOUT_S} s:\n{log.read_text()}")
        output = log.read_text()
        return Job(proc.returncode, output)

    yield run

    leftovers = outliving(_tagged_processes(tag))
    described = [_describe(p) for p in leftovers]
    _kill(leftovers)
    new_children = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in children_before and _alive(p)
    ]
    _kill(new_children)
    assert not leftovers, f"horovodrun left processes behind: {described}"
    assert not new_children, f"the test left child processes: {[p.pid for p in new_children]}"


def test_allreduce_and_broadcast_parameters(run_job) -> None:
    """Two Gloo ranks agree on sum and average all-reduce and on rank 0's broadcast weights."""
    job = run_job(SMOKE_SCRIPT)
    assert job.returncode == 0, job.output
    results = job.results()
    assert sorted(results) == list(range(NP)), job.output
    offset = 10 * sum(range(NP))
    for result in results.values():
        assert result["size"] == NP
        assert result["sum"] == [NP * i + offset for i in range(4)]
        assert result["avg"] == pytest.approx([i + offset / NP for i in range(4)])
        assert result["after"] == results[0]["before"]
    assert results[1]["before"] != results[0]["before"], "ranks must start from different weights"


def test_failing_rank_fails_the_job(run_job) -> None:
    """A rank that exits early makes horovodrun fail and stop the rank still waiting.

    The fixture then checks that the waiting rank did not outlive the job.
    """
    job = run_job(FAILING_SCRIPT)
    assert job.returncode != 0, job.output
    assert "Process name: 1\nExit code: 3" in job.output, job.output


def test_require_or_skip_skips_when_not_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``DDTK_REQUIRE`` naming it, a missing piece skips the test with the reason."""
    monkeypatch.setenv("DDTK_REQUIRE", "ray, gpu")
    with pytest.raises(pytest.skip.Exception, match="run `make horovod`"):
        require_or_skip("horovod", "run `make horovod`")
    monkeypatch.delenv("DDTK_REQUIRE")
    with pytest.raises(pytest.skip.Exception):
        require_or_skip("horovod", "run `make horovod`")


def test_require_or_skip_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``DDTK_REQUIRE=ray,horovod`` a missing Horovod fails the test instead of skipping."""
    monkeypatch.setenv("DDTK_REQUIRE", "ray,horovod")
    with pytest.raises(pytest.fail.Exception, match=r"horovod is required.*make horovod"):
        require_or_skip("horovod", "run `make horovod`")
