"""Lab 03 (a fault-tolerant training system): the judged exercises 1, 2, 3, 4, 6 and 7.

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
4. **each rank's share**: every world size on a data order seeded with the secret, and
   the world sizes that must be refused.
6. **measure each recovery** and 7. **consistency checks**: run on seeded logs the
   learner has never seen (for 7, clean ones and ones with faults planted); the judge
   computes every number and knows every violation it planted.

Exercise 5 (the elastic Ray Train loop) is still checked in the notebook's kernel.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddtk.course.checks import CheckFailed, expect
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


# ------------------------------------------------------------------ exercise 7


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


def check_consistency(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    spe = rng.choice([4, 5, 6])
    plants = [None, None, "lost commit", "duplicate sample", "disagreeing rank"]
    logs = [synthetic_log(rng, spe, p) for p in plants]
    got = ctx.worker().probe(f"{_P}:probe_consistency", logs=logs, steps_per_epoch=spe)
    for plant, log, found in zip(plants, logs, got):
        want = expected_findings(log, spe)
        what = (
            f"a seeded log with {plant} planted"
            if plant
            else "a seeded clean log (a run you have not seen)"
        )
        for key, name in (("lost", "lost_committed_steps"), ("dups", "duplicate_samples"),
                          ("disagree", "rank_disagreements"), ("schedule", "world_schedule")):  # fmt: skip
            value = [list(v) if isinstance(v, tuple) else v for v in found[key]]
            if value != want[key]:
                raise CheckFailed(f"{name} on {what}: expected {want[key][:5]}, got {value[:5]}")


JUDGE = LabJudge(
    lab="lab03-fault-tolerant",
    setup=(("69ba7d08", "all"), ("efbf0a0c", "imports"), ("8ba50ecc", "all")),
    exercises={
        1: Exercise(1, "capture and restore the full state", ("9d288f91",), check_capture, _CKPT),
        2: Exercise(2, "atomic save and a verifying loader", ("9d288f91", "3a6f6f6b"), check_atomic,
                    _CKPT, _GIVEN),
        3: Exercise(3, "a resumable training process", ("9d288f91", "3a6f6f6b", "aedc4add"),
                    check_resume, _CKPT, _GIVEN),
        4: Exercise(4, "each rank's share of the global batch", ("3dbab0ba",), check_shard, _CKPT),
        6: Exercise(6, "measure each recovery", ("dc36b336",), check_recovery, _CKPT),
        7: Exercise(7, "consistency checks", ("9c02cc25", "11371148"), check_consistency, _CKPT),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
