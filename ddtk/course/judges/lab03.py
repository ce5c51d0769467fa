"""Lab 03 (a fault-tolerant training system): the judged exercises 1 to 7.

Each check computes what a correct answer produces with the lab's own set-up code
(``ctx.ref``, instructor code only) and compares it with what the learner's code
produced in a worker (see :mod:`ddtk.course.judging`). The inputs are seeded with the
judge's secret, and each check carries something forward that only a working answer
can carry:

1. **capture and restore**: the weights get secret noise before the capture, and the
   restore happens in a *new process*: only a real snapshot (parameters, optimizer,
   step and RNG, copied) gives the uninterrupted run's parameters there.
2. **atomic save and a verifying loader**: strace, outside the learner's reach, must
   show each committed file written to a temporary name, fsynced, renamed into place,
   the manifest after its data file and the directory fsynced after the rename; the
   judge hashes the files itself, plants a torn commit, a leftover temporary file and a
   flipped byte, and checks what the loader returns against its own reference states.
3. **a resumable training process**: the judge has the learner's own code commit a
   checkpoint of a state only it knows (secret noise in the weights), then starts
   ``train()`` in a new process: only a ``train()`` that really loads the checkpoint
   ends where the judge's reference does. A ``train()`` that recomputes cannot.
4. **checkpoint on a preemption notice**: the learner's own code commits a state only
   the judge knows; then ``preemptible_train`` runs in a process of its own, forked by the
   worker (:class:`ddtk.faults.preemption.NoticeTarget`; in a notebook's own check, a new
   interpreter), with no periodic commit and a ``train_steps`` that reports each finished
   step to a file. The judge, from outside, finds that process by its token, waits until
   it has a notice handler and has finished a step, sends it a real ``SIGTERM`` and
   watches it (:class:`Preemptor`): the new
   manifest's arrival, the exit and the exit status (read from ``/proc`` while the
   process is a zombie), a ``SIGKILL`` at the end of the grace period. A second start
   gets ``SIGUSR1``. Each notice must leave exactly one new committed checkpoint, within
   the grace period, at the first step boundary after the notice, holding bit for bit the
   judge's continuation at its step (not a state saved mid-step, nor another step's); a
   last start, without a notice, must end where the judge's uninterrupted run ends.
5. **each rank's share**: every world size on a data order seeded with the secret, and
   the world sizes that must be refused.
6. **the elastic training loop and its trainer**: ``train_loop`` runs on real gloo
   ranks (``ddtk.launch``) under lab 01's stand-in of Ray Train's worker API, on a data
   set and a data order seeded with the secret and a model seed the notebook never
   used. ``get_checkpoint()`` hands out a checkpoint the learner's own ``capture_state``
   wrote of a state only the judge knows (steps with momentum, then secret noise in the
   weights). On one rank (stopped by the stop file) and on two ranks, the start events
   must say where the run resumed, each rank must log each step once with its
   ``shard(step, rank, world)``, and the parameters the probe reads from the prepared
   model must be bit for bit the judge's own continuation; a third run, with no
   checkpoint, must start at 0. The stand-in's ``report`` records every call: the steps
   must be the multiples of ``checkpoint_every`` and the last step, rank 0 alone must
   attach a checkpoint, and each one is read back (``restore_state`` into a fresh model)
   and its step, weights and momentum compared with the judge's own run at that step.
   ``elastic_trainer`` is called on seeded configs in the worker, where the
   ``TorchTrainer`` stays; its worker range, resize interval, ``max_failures``,
   ``num_to_keep`` and ``RunEvents`` callback come back as data. Ray Train itself does
   not run here (a ``TorchTrainer.fit`` costs seconds even in local mode): the
   notebook's own check runs it in local mode.
7. **measure each recovery** and 8. **consistency checks**: run on seeded logs the
   learner has never seen (for 8, clean ones and ones with faults planted); the judge
   computes every number and knows every violation it planted.

Exercise 6's worker also runs part 2's set-up cell (``log_event``, ``stop_step``,
``RunEvents``; it imports Ray Train for the ``TorchTrainer``), as one of the exercise's
cells: only that worker pays for Ray's import. The probe replaces the data set and the
data order it defines with the judge's, so an edit there changes nothing the judge
compares.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddtk.course.checks import CheckFailed, Parts, expect
from ddtk.course.judges.lab01 import _install_ray_stand_in, _Observer, _plain, _rank_failure
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
_CKPT = ("ddtk.checkpoint", "ddtk.recovery", "ddtk.faults", "torch.distributed.checkpoint")
_GIVEN = ("ddtk.checkpoint.atomic.fsync_dir",)
_HINT = (
    "(is every part of the state copied and restored: parameters, optimizer momentum, step, RNG?)"
)


# ------------------------------------------------------------------ shared by both sides


def _perturb(model: Any, noise_seed: int) -> None:
    """Add seeded noise to every parameter: a state no recomputation from scratch reaches."""
    import torch

    gen = torch.Generator().manual_seed(noise_seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)


def _params(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _mismatch(want: Mapping[str, Any], got: Any) -> list[str]:
    """Names whose tensors differ (or are missing) between ``want`` and ``got``."""
    import torch

    if not isinstance(got, Mapping):
        return ["(not a state_dict)"]
    return [
        k for k in want
        if not (isinstance(got.get(k), torch.Tensor) and got[k].shape == want[k].shape
                and torch.equal(got[k], want[k]))
    ]  # fmt: skip


# ------------------------------------------------------------------ probes (in the worker)


def probe_capture(ns: dict[str, Any], seed: int, noise_seed: int) -> Any:
    """Train 5 steps, add the judge's noise, capture, then train on: return the capture."""
    torch = ns["torch"]
    ns["seed"] = seed
    torch.manual_seed(seed)
    model, optimizer = ns["make_model"](seed)
    ns["train_steps"](model, optimizer, 0, 5)
    _perturb(model, noise_seed)
    state = ns["capture_state"](model, optimizer, 5)
    ns["train_steps"](model, optimizer, 5, 8)  # a snapshot must not move with the model
    return state


def probe_restore(ns: dict[str, Any], seed: int, state: Any, last: int) -> dict[str, Any]:
    """In a fresh process: restore ``state`` into other weights, train to ``last``."""
    torch = ns["torch"]
    ns["seed"] = seed
    torch.manual_seed(seed + 99)
    model, optimizer = ns["make_model"](seed + 1)
    step = ns["restore_state"](state, model, optimizer)
    ns["train_steps"](model, optimizer, int(step), last)
    return {"step": step, "params": _params(model)}


def probe_save(ns: dict[str, Any], seed: int, run_dir: str, steps: list[int]) -> None:
    """Train and commit ``{"model": ..., "step": ...}`` at each of ``steps`` with atomic_save."""
    ns["seed"] = seed
    ns["torch"].manual_seed(seed)  # dropout draws from the global RNG
    model, optimizer = ns["make_model"](seed)
    done = 0
    for step in steps:
        ns["train_steps"](model, optimizer, done, step)
        done = step
        ns["atomic_save"]({"model": _params(model), "step": step}, run_dir, step)


def probe_load(ns: dict[str, Any], run_dir: str) -> Any:
    """What load_latest returns for ``run_dir``: None or ``{"step", "state"}``."""
    found = ns["load_latest"](run_dir)
    if found is None:
        return None
    step, state = found
    return {"step": step, "state": state}


def probe_commit(ns: dict[str, Any], seed: int, noise_seed: int, run_dir: str, step: int) -> None:
    """Train ``step`` steps, add the judge's noise, commit with capture_state + atomic_save."""
    torch = ns["torch"]
    ns["seed"] = seed
    torch.manual_seed(seed)
    model, optimizer = ns["make_model"](seed)
    ns["train_steps"](model, optimizer, 0, step)
    _perturb(model, noise_seed)
    ns["atomic_save"](ns["capture_state"](model, optimizer, step), run_dir, step)


def probe_train(ns: dict[str, Any], seed: int, run_dir: str, steps: int, save_every: int) -> Any:
    """``train(run_dir, steps)`` with the judge's seed and no sleep; its final state_dict."""
    ns["torch"].set_num_threads(1)
    ns.update(seed=seed, drill_step_sleep=0.0, save_every=save_every)
    return {k: v.detach().clone() for k, v in ns["train"](run_dir, steps).items()}


def probe_consistency(ns: dict[str, Any], logs: list[list[dict]], steps_per_epoch: int) -> list:
    """The four consistency functions on each of ``logs``."""
    ns["STEPS_PER_EPOCH"] = steps_per_epoch
    return [
        {"lost": [list(v) for v in ns["lost_committed_steps"](log)],
         "dups": [list(v) for v in ns["duplicate_samples"](log)],
         "disagree": list(ns["rank_disagreements"](log)),
         "schedule": list(ns["world_schedule"](log))}
        for log in logs
    ]  # fmt: skip


# ------------------------------------------------------------------ references (the judge)


def reference_run(ref: dict[str, Any], seed: int, noise_seed: int, at: int, last: int) -> dict:
    """Parameters of a run trained to ``at``, given the noise, and trained on to ``last``."""
    import torch

    ref["seed"] = seed  # make_model, batch and train_steps read it from their globals
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, optimizer = ref["make_model"](seed)
        ref["train_steps"](model, optimizer, 0, at)
        _perturb(model, noise_seed)
        ref["train_steps"](model, optimizer, at, last)
    return _params(model)


def reference_states(ref: dict[str, Any], seed: int, steps: list[int]) -> dict[int, dict]:
    """The parameters probe_save commits at each of ``steps``."""
    import torch

    ref["seed"] = seed
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, optimizer = ref["make_model"](seed)
        done, out = 0, {}
        for step in steps:
            ref["train_steps"](model, optimizer, done, step)
            done = step
            out[step] = _params(model)
    return out


# ------------------------------------------------------------------ exercise 1


def check_capture(ctx: Context) -> None:
    noise = ctx.seed + 1
    state = ctx.worker().probe(f"{_P}:probe_capture", seed=ctx.seed, noise_seed=noise)
    got = ctx.worker().probe(f"{_P}:probe_restore", seed=ctx.seed, state=state, last=10)
    expect(got["step"] == 5, "the step restore_state returns", expected=5, got=got["step"])
    diff = _mismatch(reference_run(ctx.ref, ctx.seed, noise, 5, 10), got["params"])
    expect(
        not diff,
        "parameters after a capture at step 5, a restore in a new process and 5 more steps",
        expected="bit for bit those of the uninterrupted run",
        got=f"different tensors {diff} {_HINT}",
    )


# ------------------------------------------------------------------ exercise 2

_SYSCALL = re.compile(r"^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
_PATH_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD_PATH = re.compile(r"^-?\d+<([^>]*)>|^AT_FDCWD<([^>]*)>")


def trace_events(log: Path, under: str) -> list[tuple[str, str, str]]:
    """``(call, path, other)`` of the successful calls on files under ``under``, in order:
    ``("write", path, "")`` for an open for writing, ``("fsync", path, "")`` and
    ``("rename", source, target)``."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        m = _SYSCALL.match(line)
        if not m or int(m.group(3)) < 0:
            continue
        call, args = m.group(1), m.group(2)
        dirs = [next(g for g in d.groups() if g is not None) for d in
                (_FD_PATH.match(a.strip()) for a in args.split(", ")) if d]  # fmt: skip
        paths = _PATH_ARG.findall(args)
        if call in ("openat", "open", "creat") and paths:
            if call == "creat" or re.search(r"O_WRONLY|O_RDWR|O_CREAT", args):
                path = (
                    paths[0]
                    if paths[0].startswith("/")
                    else f"{dirs[0] if dirs else ''}/{paths[0]}"
                )
                events.append(("write", path, ""))
        elif call in ("fsync", "fdatasync") and dirs:
            events.append(("fsync", dirs[0], ""))
        elif call.startswith("rename") and len(paths) == 2:
            base = [*dirs, "", ""]
            src = paths[0] if paths[0].startswith("/") else f"{base[0]}/{paths[0]}"
            dst = (
                paths[1]
                if paths[1].startswith("/")
                else f"{base[1 if call != 'rename' else 0]}/{paths[1]}"
            )
            events.append(("rename", src, dst))
    return [e for e in events if e[1].startswith(under) or e[2].startswith(under)]


def durability_problems(
    events: list[tuple[str, str, str]], run_dir: str, committed: dict[str, str]
) -> list[str]:
    """What is wrong with how each committed file (manifest name -> data name) got there."""
    problems = []
    renamed: dict[str, int] = {}
    for name in [n for pair in committed.items() for n in pair]:
        final = f"{run_dir}/{name}"
        moves = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == final]
        if not moves:
            problems.append(
                f"{name} was written in place (no rename onto it): a crash mid-write leaves half a file under the final name"
            )
            continue
        at, source = moves[-1], events[moves[-1]][1]
        renamed[name] = at
        if not any(e == ("fsync", source, "") for e in events[:at]):
            problems.append(
                f"{Path(source).name} was renamed onto {name} without an fsync first: after a power cut the name can point at empty data"
            )
    for manifest, data in committed.items():
        if manifest in renamed and data in renamed and renamed[manifest] < renamed[data]:
            problems.append(f"{manifest} was committed before its data file {data}")
        if manifest in renamed and not any(
            e == ("fsync", run_dir, "") for e in events[renamed[manifest] :]
        ):
            problems.append(
                f"the directory was not fsynced after {manifest} was renamed: the rename itself can be lost"
            )
    return problems


def _committed(run_dir: Path) -> dict[str, str]:
    """Manifest name -> data file name, for every manifest the judge can read."""
    out = {}
    for path in sorted(run_dir.glob("step-*.json")):
        manifest = json.loads(path.read_text())
        expect(
            isinstance(manifest, dict) and {"step", "file", "sha256", "bytes"} <= set(manifest),
            f"the fields of {path.name}", expected="step, file, sha256, bytes",
            got=sorted(manifest) if isinstance(manifest, dict) else manifest,
        )  # fmt: skip
        data = (run_dir / manifest["file"]).read_bytes()
        expect(
            hashlib.sha256(data).hexdigest() == manifest["sha256"] and len(data) == manifest["bytes"],
            f"{manifest['file']} against its manifest", expected="the sha256 and size it records",
            got="other bytes",
        )  # fmt: skip
        out[path.name] = manifest["file"]
    return out


def _loaded(got: Any, want_step: int, want: Mapping[str, Any], what: str) -> None:
    step = None if got is None else got.get("step")
    expect(step == want_step, f"load_latest {what}", expected=want_step, got=step)
    state = got["state"]
    params = state.get("model") if isinstance(state, Mapping) else None
    expect(not _mismatch(want, params), f"the state load_latest {what} returns",
           expected=f"the one saved at step {want_step}", got="other tensors")  # fmt: skip


def check_atomic(ctx: Context) -> None:
    from ddtk.faults import corrupt_file

    worker = ctx.worker(trace=True)
    run_dir = Path(worker.folder) / f"ckpt-{ctx.seed % 10_000}"
    expect(worker.probe(f"{_P}:probe_load", run_dir=str(run_dir)) is None,
           "load_latest of a folder with no checkpoint", expected=None, got="a checkpoint")  # fmt: skip
    worker.probe(f"{_P}:probe_save", seed=ctx.seed, run_dir=str(run_dir), steps=[5, 10])
    names = sorted(p.name for p in run_dir.iterdir())
    expect(not [n for n in names if n.endswith(".tmp")], "files after two saves",
           expected="no temporary file left", got=names)  # fmt: skip
    committed = _committed(run_dir)
    expect(
        len(committed) == 2,
        "manifests after saves at steps 5 and 10",
        expected=2,
        got=len(committed),
    )
    if worker.trace_log is None:
        print("(the grader also checks, with strace, how the files were written: temporary file, "
              "fsync, rename, manifest last, directory fsynced)")  # fmt: skip
    else:
        problems = durability_problems(
            trace_events(worker.trace_log, str(run_dir)), str(run_dir), committed
        )
        expect(not problems, "how the checkpoint files were written (seen by strace)",
               expected="temporary file, fsync, rename, manifest last, directory fsynced", got="; ".join(problems))  # fmt: skip
    want = reference_states(ctx.ref, ctx.seed, [5, 10])
    _loaded(
        worker.probe(f"{_P}:probe_load", run_dir=str(run_dir)),
        10,
        want[10],
        "after saves at 5 and 10",
    )
    newest = run_dir / committed[max(committed)]
    # a torn commit: a whole, loadable data file whose manifest was never written
    (run_dir / "step-00000015.pt").write_bytes(newest.read_bytes())
    (run_dir / "step-00000020.pt.tmp").write_bytes(b"never renamed")
    _loaded(worker.probe(f"{_P}:probe_load", run_dir=str(run_dir)), 10, want[10],
            "with a complete data file that has no manifest (a torn commit) and a leftover .tmp")  # fmt: skip
    offset = corrupt_file(newest, seed=ctx.seed)
    _loaded(worker.probe(f"{_P}:probe_load", run_dir=str(run_dir)), 5, want[5],
            f"after the judge flipped a byte of step 10's data file (offset {offset})")  # fmt: skip


# ------------------------------------------------------------------ exercise 3


def check_resume(ctx: Context) -> None:
    worker = ctx.worker()
    run_dir = str(Path(worker.folder) / "run")
    noise = ctx.seed + 7
    worker.probe(f"{_P}:probe_commit", seed=ctx.seed, noise_seed=noise, run_dir=run_dir, step=10)
    worker.restart()  # a new process: only what is on disk is left
    got = worker.probe(f"{_P}:probe_train", seed=ctx.seed, run_dir=run_dir, steps=15, save_every=5)
    diff = _mismatch(reference_run(ctx.ref, ctx.seed, noise, 10, 15), got)
    expect(
        not diff,
        "train(run_dir, 15) in a new process, where the judge had a state only it knows "
        "committed at step 10",
        expected="the parameters of resuming from that checkpoint (load_latest, restore_state)",
        got=f"different tensors {diff}: train() did not resume from the newest checkpoint, or "
        "exercise 1 or 2 is wrong",
    )


# ------------------------------------------------------------------ exercise 4

_NOTICE = "b7c1e4d2"  # the answer cell: preemptible_train
NOTICE_GRACE_S = 10.0  # the judge's grace period: the commit of a tiny model takes milliseconds
NOTICE_AFTER_S = 0.1  # training between the first finished step and the notice
NOTICE_STEP_SLEEP = 0.02  # so that a notice finds the loop mid-run, a step at most from a boundary
NOTICE_NEVER = 10**6  # save_every and steps: no periodic commit, no natural end
_TARGETS: dict[str, Any] = {}  # in the worker: the started processes, by token


def probe_notice_start(ns: dict[str, Any], seed: int, run_dir: str, folder: str, tag: str,
                       fork: bool) -> dict:  # fmt: skip
    """Start ``preemptible_train(run_dir, NOTICE_NEVER)`` in a fresh process, with no
    periodic commit and a ``train_steps`` that also appends each step it finished to
    ``<tag>.progress`` (how the judge knows the run is under way, and where). Returns what
    the judge needs to find the process (its token) and to read (ready, progress, log).
    ``fork``: fork this worker (a grader's, single-threaded) instead of starting a new
    interpreter, which costs seconds of imports; a notebook's kernel is not forked."""
    from ddtk.faults.preemption import NoticeTarget

    progress = Path(folder) / f"{tag}.progress"
    given = ns["train_steps"]

    def train_steps(model: Any, optimizer: Any, first: int, last: int) -> None:
        given(model, optimizer, first, last)
        with open(progress, "a") as out:
            out.write(f"{last}\n")

    ns.update(seed=seed, drill_step_sleep=NOTICE_STEP_SLEEP, save_every=NOTICE_NEVER,
              train_steps=train_steps)  # fmt: skip
    try:
        target = NoticeTarget(ns["preemptible_train"], (run_dir, NOTICE_NEVER), folder, tag=tag,
                              fork=fork)  # fmt: skip
    finally:
        ns["train_steps"] = given
    _TARGETS[target.token] = target
    return {"token": target.token, "ready": str(target.ready), "log": str(target.log),
            "progress": str(progress), "ended": target.ended()}  # fmt: skip


def probe_notice_end(ns: dict[str, Any], token: str) -> int | None:
    """Reap the process started for ``token`` (SIGKILL first if it still runs); its exit code."""
    target = _TARGETS.pop(token, None)
    return None if target is None else target.close()


def probe_notice_finish(ns: dict[str, Any], seed: int, run_dir: str, steps: int) -> dict:
    """``preemptible_train(run_dir, steps)`` here, with no notice: its final state_dict."""
    ns["torch"].set_num_threads(1)
    ns.update(seed=seed, drill_step_sleep=0.0, save_every=NOTICE_NEVER)
    return {k: v.detach().clone() for k, v in ns["preemptible_train"](run_dir, steps).items()}


def probe_checkpoint(ns: dict[str, Any], seed: int, run_dir: str) -> dict:
    """The newest checkpoint ``load_latest`` returns, restored (``restore_state``) into a
    fresh model: its step and parameters, whatever the layout of the learner's state."""
    torch = ns["torch"]
    ns["seed"] = seed
    found = ns["load_latest"](run_dir)
    if found is None:
        return {"step": None, "params": {}}
    with torch.random.fork_rng(devices=[]):
        model, optimizer = ns["make_model"](seed + 1)
        step = ns["restore_state"](found[1], model, optimizer)
    return {"step": int(found[0]), "restored": int(step), "params": _params(model)}


def committed_steps(run_dir: Path) -> set[int]:
    """The steps whose manifest (``step-XXXXXXXX.json``) is in ``run_dir``: a name only, as
    a scheduler's watcher sees a commit from outside."""
    steps = set()
    for path in run_dir.glob("step-*.json"):
        digits = path.name[len("step-") : -len(".json")]
        if digits.isdigit():
            steps.add(int(digits))
    return steps


def _tail(log: str, chars: int = 600) -> str:
    try:
        return Path(log).read_text(errors="replace")[-chars:].strip() or "(no output)"
    except OSError:
        return "(no output)"


def progress_of(path: str) -> int | None:
    """The last step the training process reported finishing (None: none yet)."""
    try:
        lines = Path(path).read_text().split()
    except OSError:
        return None
    return int(lines[-1]) if lines and lines[-1].isdigit() else None


def _deliver(started: dict, sig: str, run_dir: Path, resumed: int) -> tuple[Any, int | None, int]:
    """From the judge's side: find the process, wait until it has finished a step, send
    ``sig``, watch. Returns the :class:`NoticeOutcome`, the exit
    code read from outside, and the last step it had finished when the notice went."""
    from ddtk.faults.preemption import Preemptor, pid_of, wait_for

    ready, token = Path(started["ready"]), started["token"]
    seen = {"alive": started["ended"]}  # once found (or known ended), "not found" means ended

    def started_or_ended() -> bool:
        if ready.exists():
            return True
        alive = pid_of(token) is not None
        seen["alive"] = seen["alive"] or alive
        return seen["alive"] and not alive

    try:
        wait_for(started_or_ended, 120.0, "the start")
    except TimeoutError:
        raise CheckFailed(
            "the training process did not call preemptible_train within 120 s"
        ) from None
    pid = pid_of(token)
    if pid is None:
        raise CheckFailed(f"the training process ended before the notice: {_tail(started['log'])}")
    try:  # a finished step: the loop runs (and has installed its handler, if it has one)
        wait_for(lambda: (progress_of(started["progress"]) or 0) > resumed or pid_of(token) is None,
                 60.0, "a step")  # fmt: skip
    except TimeoutError:
        raise CheckFailed(f"preemptible_train, resumed at step {resumed}, finished no step with "
                          "train_steps within 60 s") from None  # fmt: skip
    time.sleep(NOTICE_AFTER_S)
    before = committed_steps(run_dir)
    reached = progress_of(started["progress"]) or resumed
    outcome = Preemptor(NOTICE_GRACE_S, sig).deliver(
        [pid], committed=lambda: bool(committed_steps(run_dir) - before)
    )
    return outcome, outcome.exit_codes.get(pid), reached


def check_notice(ctx: Context) -> None:
    import signal

    worker = ctx.worker()
    folder = Path(worker.folder) / "notice"
    run_dir = folder / "run"
    noise, first = ctx.seed + 13, 3 + ctx.seed % 4
    # a state only the judge knows, committed by the learner's own capture_state + atomic_save
    worker.probe(f"{_P}:probe_commit", seed=ctx.seed, noise_seed=noise, run_dir=str(run_dir),
                 step=first)  # fmt: skip
    last = first
    for sig in ("SIGTERM", "SIGUSR1"):  # Kubernetes' notice, then Slurm's --signal=USR1@90
        before = committed_steps(run_dir)
        started = worker.probe(f"{_P}:probe_notice_start", seed=ctx.seed, run_dir=str(run_dir),
                               folder=str(folder), tag=sig.lower(), fork=not ctx.local)  # fmt: skip
        try:
            outcome, code, reached = _deliver(started, sig, run_dir, last)
        finally:
            reaped = worker.probe(f"{_P}:probe_notice_end", token=started["token"])
        code = reaped if code is None else code  # the judge's own reading first
        when = f"{sig} sent to a run resumed at step {last}"
        expect(not outcome.killed, f"the process after {when}",
               expected=f"ended on its own within the {NOTICE_GRACE_S:g} s grace period",
               got="still running at its end, and SIGKILLed (is the notice checked at every step "
                   "boundary, and does the loop then return?)")  # fmt: skip
        if code == -int(signal.Signals[sig]):
            got = (f"ended by {sig} itself: no handler for {sig} was installed, and its default "
                   "action ends the process")  # fmt: skip
        else:
            got = f"exit status {code}: {_tail(started['log'])}"
        expect(code == 0, f"the exit status after {when}", expected=0, got=got)
        new = sorted(committed_steps(run_dir) - before)
        expect(len(new) == 1, f"checkpoints committed after {when} (save_every was {NOTICE_NEVER})",
               expected="exactly one, of the step the loop had reached",
               got=new or f"none: the newest is still step {max(before, default=None)}")  # fmt: skip
        (step,) = new
        taken = outcome.seconds_to_commit
        expect(taken is not None and taken <= NOTICE_GRACE_S, f"the time from {sig} to the commit",
               expected=f"within the {NOTICE_GRACE_S:g} s grace period",
               got="never seen" if taken is None else f"{taken:.2f} s")  # fmt: skip
        expect(reached <= step <= reached + 1, f"the step committed after {when}",
               expected=f"{reached} or {reached + 1}: the first step boundary after the notice "
                        f"(step {reached} was done when it came)", got=step)  # fmt: skip
        got_ckpt = worker.probe(f"{_P}:probe_checkpoint", seed=ctx.seed, run_dir=str(run_dir))
        diff = _mismatch(reference_run(ctx.ref, ctx.seed, noise, first, step), got_ckpt["params"])
        expect(got_ckpt["step"] == step and got_ckpt.get("restored") == step and not diff,
               f"the checkpoint committed after {sig} (step-{step:08d}), restored",
               expected=f"step {step}, with the parameters after exactly {step} steps",
               got=f"step {got_ckpt['step']} (restore_state says {got_ckpt.get('restored')}), "
                   f"different tensors {diff}: saved mid-step, from the handler, or with another step's number?")  # fmt: skip
        last = step
    final = worker.probe(f"{_P}:probe_notice_finish", seed=ctx.seed, run_dir=str(run_dir),
                         steps=last + 3)  # fmt: skip
    diff = _mismatch(reference_run(ctx.ref, ctx.seed, noise, first, last + 3), final)
    expect(not diff, f"preemptible_train(run_dir, {last + 3}) after the two notices, with none",
           expected="the parameters of the uninterrupted run, bit for bit",
           got=f"different tensors {diff}: did it resume from the notice's checkpoint?")  # fmt: skip


# ------------------------------------------------------------------ exercise 5

DATASET_SIZE, GLOBAL_BATCH = 96, 16


def lab_global_ids(seed: int, step: int) -> list[int]:
    """The lab's sample order (its ``global_ids``): epoch ``step // 6``'s seeded permutation."""
    import torch

    per_epoch = DATASET_SIZE // GLOBAL_BATCH
    gen = torch.Generator().manual_seed(seed * 1000 + step // per_epoch)
    order = torch.randperm(DATASET_SIZE, generator=gen)
    return order[(step % per_epoch) * GLOBAL_BATCH :][:GLOBAL_BATCH].tolist()


def probe_shard(ns: dict[str, Any], seed: int, cases: list[tuple[int, int, int]]) -> list:
    """``shard(step, rank, world)`` for each case: the ids, or ``"ValueError"``."""
    ns.update(seed=seed, DATASET_SIZE=DATASET_SIZE, GLOBAL_BATCH=GLOBAL_BATCH,
              STEPS_PER_EPOCH=DATASET_SIZE // GLOBAL_BATCH,
              global_ids=lambda step: lab_global_ids(seed, step))  # fmt: skip
    out: list = []
    for step, rank, world in cases:
        try:
            out.append([int(i) for i in ns["shard"](step, rank, world)])
        except ValueError:
            out.append("ValueError")
    return out


def expected_shard(seed: int, step: int, rank: int, world: int) -> list[int] | str:
    if world < 1 or not 0 <= rank < world or GLOBAL_BATCH % world:
        return "ValueError"
    share = GLOBAL_BATCH // world
    return lab_global_ids(seed, step)[rank * share : (rank + 1) * share]


def check_shard(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    cases = [
        (rng.randrange(40), r, w) for w in (1, 2, 4, 8, 16) for r in range(w) for _ in range(2)
    ]
    cases += [(rng.randrange(40), 0, 3), (rng.randrange(40), 2, 2), (rng.randrange(40), 0, 0),
              (rng.randrange(40), 1, 6)]  # fmt: skip
    got = ctx.worker().probe(f"{_P}:probe_shard", seed=ctx.seed, cases=cases)
    for (step, rank, world), value in zip(cases, got):
        want = expected_shard(ctx.seed, step, rank, world)
        expect(value == want, f"shard({step}, {rank}, {world}) with a data order you have not seen",
               expected=want, got=value)  # fmt: skip


# ------------------------------------------------------------------ exercise 6

_PART2 = "69e816fd"  # part 2's set-up: the data, log_event, stop_step, RunEvents
_HANDED_OUT = tuple(f"ddtk.recovery.common.{n}" for n in ("build", "fingerprint", "global_batch",
                                                          "loss_fn"))  # fmt: skip


def lab_dataset(seed: int) -> tuple[Any, Any]:
    """The lab's data set (its ``X, Y``) for ``seed``: 96 samples of 16 features, 4 classes."""
    from ddtk.recovery.common import global_batch

    return global_batch(10_000, batch_size=DATASET_SIZE, seed=seed)


def train_reference(model: Any, optimizer: Any, data: tuple[Any, Any], seed: int, first: int,
                    last: int, world: int) -> None:  # fmt: skip
    """Steps ``first..last-1`` as the lab's ``replay`` trains them on ``world`` simulated
    ranks: each rank's contiguous share, its gradient scaled by 1/world and the shares added
    in rank order (what DDP gives, bit for bit, on 1 and 2 ranks)."""
    from ddtk.recovery.common import loss_fn

    x, y = data
    params = list(model.parameters())
    for step in range(first, last):
        ids, share, total = lab_global_ids(seed, step), GLOBAL_BATCH // world, None
        for rank in range(world):
            mine = ids[rank * share : (rank + 1) * share]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[mine]), y[mine]).backward()
            grads = [p.grad.detach().clone() * (1.0 / world) for p in params]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        for p, g in zip(params, total):
            p.grad = g
        optimizer.step()


def _momentum(model: Any, optimizer: Any) -> dict[str, Any]:
    """SGD's momentum buffer of each parameter that has one, by parameter name."""
    return {name: optimizer.state[p]["momentum_buffer"].detach().clone()
            for name, p in model.named_parameters()
            if optimizer.state.get(p, {}).get("momentum_buffer") is not None}  # fmt: skip


def planted_state(seed: int, model_seed: int, at: int, noise_seed: int) -> tuple[Any, Any]:
    """The model and optimizer of the checkpoint the judge plants: ``at`` steps on one rank
    (momentum built up), then secret noise in the weights, a state no fresh start reaches."""
    import torch

    from ddtk.recovery.common import build

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the judge's reference and in the ranks: the same bits
    try:
        model, optimizer = build(model_seed)
        train_reference(model, optimizer, lab_dataset(seed), seed, 0, at, 1)
        _perturb(model, noise_seed)
    finally:
        torch.set_num_threads(threads)
    return model, optimizer


def report_steps(start: int, stop: int, every: int) -> list[int]:
    """The steps a run from ``start`` to ``stop`` reports at: multiples of ``every``, the last."""
    return [s for s in range(start + 1, stop + 1) if s % every == 0 or s == stop]


def reference_elastic(seed: int, model_seed: int, case: Mapping[str, Any]) -> dict[str, Any]:
    """The judge's own run of ``case``: the final parameters, and the parameters and
    momentum at every step the loop must checkpoint."""
    import torch

    from ddtk.recovery.common import build

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the ranks: the same kernels, the same bits
    try:
        with torch.random.fork_rng(devices=[]):
            if case["at"] is None:
                (model, optimizer), start = build(model_seed), 0
            else:
                model, optimizer = planted_state(seed, model_seed, case["at"], case["noise_seed"])
                start = case["at"]
            data, stop, states = lab_dataset(seed), case_stop(case), {}
            for step in range(start, stop):
                train_reference(model, optimizer, data, seed, step, step + 1, case["world"])
                if step + 1 in report_steps(start, stop, case["every"]):
                    states[step + 1] = {"model": _params(model),
                                        "momentum": _momentum(model, optimizer)}  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return {"params": _params(model), "states": states}


def case_stop(case: Mapping[str, Any]) -> int:
    """Where a case's run stops: ``max_steps``, or the step its stop file names."""
    return case["max_steps"] if case["stop_file"] is None else min(case["max_steps"],
                                                                   case["stop_file"])  # fmt: skip


def elastic_cases(rng: random.Random) -> list[dict[str, Any]]:
    """Seeded runs: one rank resuming from a planted checkpoint and told to stop by the stop
    file, two ranks resuming from one between two checkpoint steps, one rank from scratch
    (the one-rank run first: it costs least, and most wrong loops fail it)."""
    cases = []
    every = rng.choice([2, 3, 4])
    at = rng.choice([a for a in range(3, 10) if a % every])
    cases.append({"world": 1, "at": at, "every": every, "max_steps": at + 40,
                  "stop_file": at + every + rng.randint(1, every)})  # fmt: skip
    every = rng.choice([3, 5])
    at = rng.choice([a for a in range(2, 9) if a % every])
    cases.append({"world": 2, "at": at, "every": every, "stop_file": None,
                  "max_steps": at + 2 * every + rng.randint(1, every - 1)})  # fmt: skip
    cases.append({"world": 1, "at": None, "every": rng.choice([2, 3]), "stop_file": None,
                  "max_steps": rng.randint(5, 7)})  # fmt: skip
    for case in cases:
        case["noise_seed"] = rng.randrange(2**31)
    return cases


def _elastic_rank(ctx: Any, functions: bytes, config: dict[str, Any], planted: str | None,
                  storage: str) -> dict[str, Any]:  # fmt: skip
    """One rank of the exercise-5 probe: Ray Train's worker API stood in for (its
    ``get_checkpoint`` hands out the planted checkpoint), then the learner's loop. Each
    reported checkpoint is read back with the learner's ``restore_state`` into a fresh
    model, so what it holds comes back as tensors."""
    import cloudpickle
    import torch

    from ddtk.recovery.common import build

    found: dict[str, Any] = {}

    def read(folder: Any, name: str) -> dict[str, Any]:
        files = sorted(p.name for p in folder.iterdir())
        out: dict[str, Any] = {"dir": name, "files": files}
        if "state.pt" not in files:
            return out
        try:
            with torch.random.fork_rng(devices=[]):
                model, optimizer = build(config["seed"])
                step = found["restore"](
                    torch.load(folder / "state.pt", weights_only=False), model, optimizer
                )
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            return out
        out.update(step=_plain(step), model=_params(model), momentum=_momentum(model, optimizer))
        return out

    observer = _Observer()  # only its record of prepare_model's models: nothing patched
    node = f"{ctx.rank + 1:02x}" * 28
    reports = _install_ray_stand_in(ctx.rank, ctx.world_size, node, {}, storage, observer,
                                    checkpoint=planted, read=read)  # fmt: skip
    loop, found["restore"] = cloudpickle.loads(functions)  # after the stand-in: `ray` is it
    loop(dict(config))
    return {"reports": reports, "params": observer.final_params(),
            "prepared": len(observer.prepared)}  # fmt: skip


def probe_elastic(ns: dict[str, Any], seed: int, model_seed: int, case: dict[str, Any],
                  folder: str) -> dict[str, Any]:  # fmt: skip
    """``train_loop(config)`` on ``case["world"]`` gloo ranks under the stand-in of Ray
    Train's worker API, on the judge's data order and data set, from the checkpoint the
    judge had the learner's ``capture_state`` write: what each rank reported and ended
    with, and the event log the ranks wrote."""
    import cloudpickle
    import torch

    import ddtk

    x, y = lab_dataset(seed)
    ns.update(seed=seed, DATASET_SIZE=DATASET_SIZE, GLOBAL_BATCH=GLOBAL_BATCH, X=x, Y=y,
              STEPS_PER_EPOCH=DATASET_SIZE // GLOBAL_BATCH,
              global_ids=lambda step: lab_global_ids(seed, step))  # fmt: skip
    run = Path(folder) / f"run-{case['noise_seed']}"
    (run / "events").mkdir(parents=True)
    planted = None
    if case["at"] is not None:
        planted = run / "planted"
        planted.mkdir()
        with torch.random.fork_rng(devices=[]):
            model, optimizer = planted_state(seed, model_seed, case["at"], case["noise_seed"])
            state = ns["capture_state"](model, optimizer, case["at"])
        torch.save(state, planted / "state.pt")
    if case["stop_file"] is not None:
        (run / "stop").write_text(str(case["stop_file"]))
    config = {"seed": model_seed, "log_dir": str(run / "events"), "stop_file": str(run / "stop"),
              "max_steps": case["max_steps"], "checkpoint_every": case["every"],
              "step_sleep": 0.0, "max_workers": case["world"], "resize_interval": 1.0}  # fmt: skip
    functions = cloudpickle.dumps((ns["train_loop"], ns["restore_state"]))
    try:
        ranks = ddtk.launch(_elastic_rank, world_size=case["world"], backend="gloo", timeout=60,
                            echo=False, args=(functions, config, planted and str(planted),
                                              str(run / "storage")))  # fmt: skip
    except ddtk.RankError as exc:
        raise _rank_failure(exc) from None
    events = [json.loads(line) for path in sorted((run / "events").glob("*.jsonl"))
              for line in path.read_text().splitlines() if line.strip()]  # fmt: skip
    return {"ranks": ranks, "events": _plain(sorted(events, key=lambda e: e.get("t", 0)))}


def probe_trainer(ns: dict[str, Any], configs: list[dict[str, Any]], folder: str) -> list[dict]:
    """``elastic_trainer(config, storage)`` for each config: what the TorchTrainer (which
    stays here) was given, read as data."""
    out = []
    for i, config in enumerate(configs):
        storage = str(Path(folder) / f"storage-{i}")
        trainer = ns["elastic_trainer"](dict(config), storage)
        scaling = getattr(trainer, "scaling_config", None)
        run = getattr(trainer, "run_config", None)
        loop = getattr(trainer, "train_loop_per_worker", None)
        events = ns.get("RunEvents")
        out.append({
            "type": type(trainer).__name__,
            "loop": loop is ns.get("train_loop") or getattr(loop, "__name__", "") == "train_loop",
            "config": _plain(getattr(trainer, "train_loop_config", None)),
            "num_workers": _plain(getattr(scaling, "num_workers", None)),
            "resize": _plain(getattr(scaling, "elastic_resize_monitor_interval_s", None)),
            "max_failures": _plain(getattr(getattr(run, "failure_config", None), "max_failures", None)),
            "num_to_keep": _plain(getattr(getattr(run, "checkpoint_config", None), "num_to_keep", None)),
            "callbacks": [{"type": type(c).__name__, "log_dir": _plain(getattr(c, "log_dir", None)),
                           "run_events": isinstance(events, type) and isinstance(c, events)}
                          for c in (getattr(run, "callbacks", None) or [])],
        })  # fmt: skip
    return out


def trainer_configs(rng: random.Random, folder: str) -> list[dict[str, Any]]:
    """Seeded configs for ``elastic_trainer``: worker counts and resize intervals the
    notebook never used."""
    return [{"seed": rng.randrange(100), "log_dir": f"{folder}/events-{i}",
             "stop_file": f"{folder}/stop-{i}", "max_steps": rng.randint(20, 90),
             "checkpoint_every": rng.randint(3, 9), "step_sleep": 0.0,
             "max_workers": w, "resize_interval": round(rng.uniform(0.5, 9.5), 2)}
            for i, w in enumerate(rng.sample([2, 3, 4, 5, 6, 8], 2))]  # fmt: skip


def _check_trainer(config: Mapping[str, Any], got: Mapping[str, Any]) -> None:
    call = (f"elastic_trainer(config, storage) with the grader's config (max_workers "
            f"{config['max_workers']}, resize_interval {config['resize_interval']})")  # fmt: skip
    expect(got["type"] == "TorchTrainer" and got["loop"], f"what {call} returns",
           expected="a TorchTrainer of train_loop", got=got["type"])  # fmt: skip
    expect(got["config"] == dict(config), f"the train_loop_config of {call}",
           expected="the config it was given", got=got["config"])  # fmt: skip
    workers = [1, config["max_workers"]]
    expect(got["num_workers"] == workers, f"ScalingConfig.num_workers of {call}",
           expected=f"(1, {config['max_workers']}): elastic, from 1 to max_workers workers",
           got=got["num_workers"])  # fmt: skip
    expect(got["resize"] == config["resize_interval"],
           f"ScalingConfig.elastic_resize_monitor_interval_s of {call}",
           expected=config["resize_interval"], got=got["resize"])  # fmt: skip
    failures = got["max_failures"]
    expect(isinstance(failures, int) and (failures >= 3 or failures == -1),
           f"FailureConfig.max_failures of {call}",
           expected=">= 3 (part 3 causes three faults; each restart counts)", got=failures)  # fmt: skip
    expect(got["num_to_keep"] == 2, f"CheckpointConfig.num_to_keep of {call}", expected=2,
           got=got["num_to_keep"])  # fmt: skip
    logged = [c for c in got["callbacks"] if c["run_events"] and c["log_dir"] == config["log_dir"]]
    expect(len(logged) == 1, f"RunConfig.callbacks of {call}",
           expected="RunEvents(config['log_dir']) (it logs the commits and failures)",
           got=[(c["type"], c["log_dir"]) for c in got["callbacks"]])  # fmt: skip


def _without_t(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("t", "pid", "node")} for e in events]


def _check_run(case: Mapping[str, Any], got: Mapping[str, Any], want: Mapping[str, Any],
               seed: int) -> None:  # fmt: skip
    world, at, every = case["world"], case["at"], case["every"]
    start, stop = at or 0, case_stop(case)
    setting = (
        f"(the grader's run on {world} rank(s), "
        + (f"resuming from a checkpoint it planted at step {at}" if at else "with no checkpoint")
        + f", checkpoint_every {every}, stop_step {stop}"
        + (" from the stop file" if case["stop_file"] is not None else "") + ")"
    )  # fmt: skip
    events, ranks = got["events"], got["ranks"]
    for r in range(world):
        starts = [e for e in events if e.get("kind") == "start" and e.get("rank") == r]
        hint = ""
        if at and starts and starts[0].get("resumed_from") == 0:
            hint = ": the loop did not resume from ray.train.get_checkpoint()"
        ok = len(starts) == 1 and starts[0].get("resumed_from") == start
        expect(ok and starts[0].get("world") == world, f"rank {r}'s start event {setting}",
               expected=f"one, world {world}, resumed_from {start}",
               got=f"{_without_t(starts)[:2]}{hint}")  # fmt: skip
        steps = [e for e in events if e.get("kind") == "step" and e.get("rank") == r]
        expect([e.get("step") for e in steps] == list(range(start, stop)),
               f"the steps rank {r} logged {setting}", expected=f"{start} to {stop - 1}, once each",
               got=[e.get("step") for e in steps])  # fmt: skip
        for e in steps:
            ids = expected_shard(seed, e["step"], r, world)
            expect(e.get("samples") == ids and e.get("world") == world,
                   f"what rank {r} trained on at step {e['step']} {setting}",
                   expected=f"shard({e['step']}, {r}, {world}) = {ids} in a world of {world}",
                   got=f"{e.get('samples')} in a world of {e.get('world')}")  # fmt: skip
    for r, rank in enumerate(ranks):
        expect(rank["prepared"] >= 1, f"rank {r}'s model {setting}",
               expected="wrapped by ray.train.torch.prepare_model", got="never prepared")  # fmt: skip
        diff = _mismatch(want["params"], rank["params"])
        expect(not diff, f"rank {r}'s parameters at the end, read by the grader {setting}",
               expected="bit for bit those of the grader's run (restore_state of the checkpoint: "
               "weights, momentum and step; then each step on shard(step, rank, world))",
               got=f"different tensors {diff} (is the whole state restored? or is exercise 1 or 4 "
               "wrong?)")  # fmt: skip
    steps_due = report_steps(start, stop, every)
    for r, rank in enumerate(ranks):
        reports = rank["reports"]
        said = [rep["metrics"].get("step") if isinstance(rep["metrics"], dict) else None
                for rep in reports]  # fmt: skip
        expect(said == steps_due, f"the steps of rank {r}'s ray.train.report calls {setting}",
               expected=f"{steps_due} (each multiple of checkpoint_every, and the last step)",
               got=said)  # fmt: skip
        for step, rep in zip(steps_due, reports):
            expect(rep["metrics"].get("world") == world, f"rank {r}'s report at step {step}",
                   expected=f"world {world}", got=rep["metrics"])  # fmt: skip
            ckpt = rep["checkpoint"]
            if r:
                expect(ckpt is None, f"rank {r}'s report at step {step} {setting}",
                       expected="checkpoint=None (rank 0 alone attaches the checkpoint)",
                       got=f"a checkpoint holding {ckpt and ckpt['files']}")  # fmt: skip
                continue
            expect(ckpt is not None, f"rank 0's report at step {step} {setting}",
                   expected="a checkpoint (a directory holding state.pt)", got="checkpoint=None")  # fmt: skip
            expect("state.pt" in ckpt["files"] and "error" not in ckpt,
                   f"rank 0's checkpoint at step {step}, restored by the grader with restore_state",
                   expected="a state.pt that restore_state loads",
                   got=ckpt.get("error") or ckpt["files"])  # fmt: skip
            diff = _mismatch(want["states"][step]["model"], ckpt.get("model"))
            diff += _mismatch(want["states"][step]["momentum"], ckpt.get("momentum"))
            expect(ckpt.get("step") == step and not diff,
                   f"the state in rank 0's checkpoint at step {step} {setting}",
                   expected=f"step {step}, the grader's weights and momentum at that step",
                   got=f"step {ckpt.get('step')}, different tensors {diff}")  # fmt: skip


def check_elastic(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    worker = ctx.worker()
    folder = str(worker.folder)
    configs = trainer_configs(rng, folder)
    for config, got in zip(configs, worker.probe(f"{_P}:probe_trainer", configs=configs,
                                                  folder=folder)):  # fmt: skip
        _check_trainer(config, got)
    seed, model_seed = rng.randrange(1, 10_000), rng.randrange(1, 10_000)
    for case in elastic_cases(rng):
        got = worker.probe(f"{_P}:probe_elastic", seed=seed, model_seed=model_seed, case=case,
                           folder=folder)  # fmt: skip
        _check_run(case, got, reference_elastic(seed, model_seed, case), seed)


# ------------------------------------------------------------------ exercise 7


def probe_recovery(ns: dict[str, Any], cases: list[tuple[list[dict], float]]) -> list:
    """``recovery_metrics(events, t_fault)`` for each case."""
    return [dict(ns["recovery_metrics"](events, t_fault)) for events, t_fault in cases]


def expected_recovery(events: list[dict], t_fault: float) -> dict:
    """What the lab defines each number of a recovery to be."""
    start = next(e for e in events if e["kind"] == "start" and e["t"] > t_fault)
    began = max(e["t"] for e in events if e["kind"] == "start" and e["t"] <= t_fault)
    before = [e for e in events if e["kind"] == "step" and began <= e["t"] < start["t"]]
    first = next(e for e in events if e["kind"] == "step" and e["t"] > start["t"])
    last = max(before, key=lambda e: (e["step"], e["t"]))
    return {"world_before": last["world"], "world_after": first["world"],
            "last_step_before": last["step"], "resumed_from": start["resumed_from"],
            "steps_lost": last["step"] + 1 - start["resumed_from"],
            "restart_s": start["t"] - t_fault, "recovery_s": first["t"] - t_fault}  # fmt: skip


def recovery_log(rng: random.Random) -> tuple[list[dict], list[float]]:
    """A seeded run with faults: steps go on for a moment after each fault (survivors finish
    a step), commits every 3 steps, each restart resumes from the last commit."""
    events: list[dict] = []
    faults: list[float] = []
    t, step, committed, world = 0.0, 0, 0, rng.choice([2, 3])
    events.append({"kind": "start", "t": t, "rank": 0, "world": world, "resumed_from": 0})
    for _attempt in range(rng.randint(2, 3)):
        for _ in range(rng.randint(4, 8)):
            t += round(rng.uniform(0.4, 0.9), 3)
            events += [{"kind": "step", "t": t + 0.001 * r, "step": step, "rank": r, "world": world}
                       for r in range(world)]  # fmt: skip
            step += 1
            if step % 3 == 0:
                committed = step
                events.append({"kind": "commit", "t": t + 0.01, "step": step})
        fault = t - round(rng.uniform(0.1, 0.3), 3)  # the last step ends after the fault
        faults.append(fault)
        world = rng.choice([1, 2, 3])
        t += round(rng.uniform(2.0, 9.0), 3)
        events.append(
            {"kind": "start", "t": t, "rank": 0, "world": world, "resumed_from": committed}
        )
        step = committed
    t += round(rng.uniform(0.5, 1.5), 3)
    events += [{"kind": "step", "t": t + 0.001 * r, "step": step, "rank": r, "world": world}
               for r in range(world)]  # fmt: skip
    return sorted(events, key=lambda e: e["t"]), faults


def check_recovery(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    cases = []
    for _ in range(3):
        events, faults = recovery_log(rng)
        cases += [(events, fault) for fault in faults]
    got = ctx.worker().probe(f"{_P}:probe_recovery", cases=cases)
    for (events, fault), value in zip(cases, got):
        want = expected_recovery(events, fault)
        wrong = {k: value.get(k) for k in want if not _close(value.get(k), want[k])}
        expect(not wrong, f"recovery_metrics on a seeded log (fault at {fault:.3f} s)",
               expected={k: want[k] for k in wrong}, got=wrong)  # fmt: skip


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, float):
        return isinstance(got, int | float) and abs(got - want) <= 1e-9
    return got == want


# ------------------------------------------------------------------ exercise 8


def _effective(events: list[dict]) -> list[dict]:
    """Each step's records from its last execution, in step order (as the lab defines it)."""
    by_step: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] == "step":
            by_step.setdefault(e["step"], []).append(e)
    history = []
    for step in sorted(by_step):
        last = max(by_step[step], key=lambda e: e["t"])
        latest: dict[int, dict] = {}
        for e in by_step[step]:
            if e["world"] == last["world"] and (
                e["rank"] not in latest or e["t"] > latest[e["rank"]]["t"]
            ):
                latest[e["rank"]] = e
        history += [latest[r] for r in sorted(latest)]
    return history


def expected_findings(events: list[dict], steps_per_epoch: int) -> dict[str, list]:
    """What correct consistency checks find in ``events``."""
    lost, committed = [], 0
    for e in events:
        if e["kind"] == "commit":
            committed = max(committed, e["step"])
        elif e["kind"] == "start" and e["resumed_from"] < committed:
            lost.append([e["t"], committed, e["resumed_from"]])
    history = _effective(events)
    seen, dups = set(), []
    for e in history:
        for i in e["samples"]:
            key = (e["step"] // steps_per_epoch, i)
            if key in seen:
                dups.append(list(key))
            seen.add(key)
    fps: dict[int, set] = {}
    worlds: dict[int, int] = {}
    for e in history:
        fps.setdefault(e["step"], set()).add(e["fp"])
        worlds[e["step"]] = e["world"]
    return {"lost": lost, "dups": dups, "disagree": sorted(s for s, f in fps.items() if len(f) > 1),
            "schedule": [worlds[s] for s in sorted(worlds)]}  # fmt: skip


def synthetic_log(rng: random.Random, steps_per_epoch: int, plant: str | None) -> list[dict]:
    """A seeded elastic run's event log (restarts, resizes, commits), with one fault planted."""
    batch, t, events = 12, 0.0, []
    total, committed, step = rng.randint(14, 22), 0, 0
    for attempt in range(rng.randint(2, 4)):
        world = rng.choice([1, 2, 3]) if attempt else 2
        resumed = committed
        if plant == "lost commit" and attempt == 1:
            resumed = max(0, committed - rng.choice([2, 3]))
        t += 1.0
        events.append({"kind": "start", "t": t, "rank": 0, "world": world, "resumed_from": resumed})
        step, crash = resumed, rng.randint(resumed + 3, resumed + 8)
        while step < min(crash, total):
            epoch = step // steps_per_epoch
            order = random.Random(epoch * 7919 + 3).sample(
                range(batch * steps_per_epoch), batch * steps_per_epoch
            )
            ids = order[(step % steps_per_epoch) * batch :][:batch]
            share = batch // world
            for rank in range(world):
                t += 0.01
                events.append({"kind": "step", "t": t, "step": step, "rank": rank, "world": world,
                               "samples": ids[rank * share : (rank + 1) * share], "fp": f"fp-{step}-{attempt}"})  # fmt: skip
            step += 1
            if step % 3 == 0:
                t += 0.01
                committed = step
                events.append({"kind": "commit", "t": t, "step": step})
        if step >= total:
            break
    if plant == "duplicate sample":  # a rank trains on a sample of the step before, same epoch
        history = _effective(events)
        for a, b in itertools.pairwise(history):
            if (
                a["step"] != b["step"]
                and a["step"] // steps_per_epoch == b["step"] // steps_per_epoch
            ):
                b["samples"] = [a["samples"][0], *b["samples"][1:]]
                break
    elif plant == "disagreeing rank":
        history = _effective(events)
        victims = [e for e in history if e["world"] > 1] or history
        rng.choice(victims)["fp"] = "0" * 16
    return events


def _replayed_at_another_world(events: list[dict]) -> bool:
    """True when some step ran again after a restart at another world size: only such a log
    tells a schedule built from each step's last execution from one built from its first."""
    worlds: dict[int, set[int]] = {}
    for e in events:
        if e["kind"] == "step":
            worlds.setdefault(e["step"], set()).add(e["world"])
    return any(len(w) > 1 for w in worlds.values())


def check_consistency(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    spe = rng.choice([4, 5, 6])
    plants = [None, None, "lost commit", "duplicate sample", "disagreeing rank"]
    logs = [synthetic_log(rng, spe, p) for p in plants]
    while not any(_replayed_at_another_world(log) for log in logs):  # so that every rule is tested
        logs = [synthetic_log(rng, spe, p) for p in plants]
    got = ctx.worker().probe(f"{_P}:probe_consistency", logs=logs, steps_per_epoch=spe)
    wants = [expected_findings(log, spe) for log in logs]
    parts = Parts()  # four functions, four parts: each one right earns its share
    for key, name in (("lost", "lost_committed_steps"), ("dups", "duplicate_samples"),
                      ("disagree", "rank_disagreements"), ("schedule", "world_schedule")):  # fmt: skip
        with parts.part(name):
            for plant, want, found in zip(plants, wants, got):
                what = (
                    f"a seeded log with {plant} planted"
                    if plant
                    else "a seeded clean log (a run you have not seen)"
                )
                value = [list(v) if isinstance(v, tuple) else v for v in found[key]]
                if value != want[key]:
                    raise CheckFailed(f"on {what}: expected {want[key][:5]}, got {value[:5]}")
    parts.finish()


JUDGE = LabJudge(
    lab="lab03-fault-tolerant",
    setup=(("69ba7d08", "all"), ("efbf0a0c", "imports"), ("8ba50ecc", "all")),
    exercises={
        1: Exercise(1, "capture and restore the full state", ("9d288f91",), check_capture, _CKPT),
        2: Exercise(2, "atomic save and a verifying loader", ("9d288f91", "3a6f6f6b"), check_atomic,
                    _CKPT, _GIVEN),
        3: Exercise(3, "a resumable training process", ("9d288f91", "3a6f6f6b", "aedc4add"),
                    check_resume, _CKPT, _GIVEN),
        4: Exercise(4, "checkpoint on a preemption notice", ("9d288f91", "3a6f6f6b", _NOTICE),
                    check_notice, _CKPT, _GIVEN),
        5: Exercise(5, "each rank's share of the global batch", ("3dbab0ba",), check_shard, _CKPT),
        6: Exercise(6, "the elastic training loop", (_PART2, "9d288f91", "3dbab0ba", "5b9bab2f"),
                    check_elastic, _CKPT, _HANDED_OUT),
        7: Exercise(7, "measure each recovery", ("dc36b336",), check_recovery, _CKPT),
        8: Exercise(8, "consistency checks", ("9c02cc25", "11371148"), check_consistency, _CKPT),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
