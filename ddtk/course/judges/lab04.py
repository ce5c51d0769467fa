"""Lab 04 (profiling and optimising distributed training): the judged exercises 1 to 6.

Each check feeds the learner's code inputs seeded with the judge's secret, computes
what a correct answer gives with trusted code in the judge's own process (the
interval arithmetic and breakdown of :mod:`ddtk.profiling`, never the learner's), and
compares (see :mod:`ddtk.course.judging`). What each carries forward that only a
working answer can:

1. **profile a DDP loop on every rank**: the judge launches ``profiled_ddp`` on two
   gloo ranks into a folder it names, then reads the files itself: one trace per rank,
   each claiming its own rank of a two-rank process group (``distributedInfo``), with
   exactly ``ProfilerStep#2..4``, recorded during the probe (on the shared clock); in
   every profiled step the optimizer step, DDP's backward and ``gloo:all_reduce``
   messages with their shapes that add up to at least the model's gradients (19,210
   floats), and the two ranks' steps overlapping in time: they trained together.
2. **where each step's time went**: ``step_times`` on seeded interval sets (spans that
   overlap across categories and cross the window's edges, steps with nothing in
   flight), against :func:`ddtk.profiling.breakdown.step_parts`.
3. **read the evidence**: ``read_evidence`` on seeded breakdowns of 2 to 5 ranks with a
   planted straggler and, on another rank, one step the operating system stretched
   (only medians name the right rank), step times that differ (only totals give the
   time-weighted share), message counts that differ from step to step, and a job with
   no collective at all.
4. **name the bottlenecks**: ``name_bottlenecks`` on seeded evidence with several
   problems at once and values exactly at and just under each rule's threshold, under
   the lab's ``RULES`` and under seeded ones (thresholds written into the code fail);
   each sentence must state the bottleneck's number.
5. **one fix per bottleneck**: ``fix`` on seeded configurations; only the row's fields
   may change; the input fix must give enough data-loader workers for the judge's
   ``data_ms`` and ``step_ms`` (workers x step time >= data time) and not absurdly many;
   an unknown kind, seeded, must raise a ValueError that names it.
6. **measure, keep or revert**: ``optimise`` with a ``measure`` and a ``fix`` of the
   judge's (so it stands alone from exercise 5), on seeded throughputs and a seeded
   ``min_gain``: a clear gain, a loss followed by a gain inside the noise floor, a
   gain inside the noise floor after a kept one, and one between ``min_gain`` and 5 %.
   The judge records every configuration really measured and checks the rows are those
   measurements (each carries a token it planted) and the configuration returned.

The real profiled runs of part 3 and the prose of the hand-in are not judged: they
are measurements of this machine, which the notebook's own cells show.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ddtk.course.checks import CheckFailed, expect
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
# What the lab hands out from ddtk.profiling in its set-up cell: an answer may import these.
_GIVEN = tuple(
    [f"ddtk.profiling.{n}" for n in ("JOBS", "JobConfig", "analyse", "explain", "load_traces",
                                     "plot_timeline", "run_job", "stragglers")]
    + [f"ddtk.profiling.breakdown.{n}" for n in ("Breakdown", "StepBreakdown", "lanes")]
    + [f"ddtk.profiling.intervals.{n}" for n in ("clip", "intersect", "length", "subtract", "union")]
)  # fmt: skip
# ddtk.profiling implements every exercise (StepProfiler, step_parts, diagnose ...);
# Holistic Trace Analysis computes temporal breakdowns too.
_FORBID = ("ddtk.profiling", "hta")

# ------------------------------------------------------------------ exercise 1

WORLD = 2
STEPS = 6  # wait 1 + warm-up 1 + active 3, and one step after the window
MODEL_FLOATS = 64 * 256 + 256 + 256 * 10 + 10  # the lab's model: its gradients, in floats


def probe_profile(ns: dict[str, Any], trace_dir: str, steps: int) -> float:
    """Launch the learner's ``profiled_ddp`` on two gloo ranks; the launch's wall time (s)."""
    import ddtk

    Path(trace_dir).mkdir(parents=True, exist_ok=True)  # as the notebook's check gives it
    t0 = time.perf_counter()
    ddtk.launch(ns["profiled_ddp"], world_size=WORLD, args=(trace_dir, steps), backend="gloo",
                timeout=90, echo=False)  # fmt: skip
    return time.perf_counter() - t0


def _trace_problems(path: Path, rank: int, began: float, ended: float) -> list[str]:
    """What is wrong with rank ``rank``'s trace ``path``, read and analysed here."""
    from ddtk.profiling.breakdown import _message_bytes
    from ddtk.profiling.trace import TraceError, load_trace

    try:
        info = json.loads(path.read_text()).get("distributedInfo") or {}
        trace = load_trace(path)
    except (TraceError, ValueError, OSError) as exc:
        return [f"{path.name} is not a trace the profiler wrote ({str(exc)[:200]})"]
    name = path.name
    if (info.get("rank"), info.get("world_size")) != (rank, WORLD):
        return [f"{name} was not written by rank {rank} of the {WORLD}-rank job "
                f"(distributedInfo says rank {info.get('rank')} of {info.get('world_size')})"]  # fmt: skip
    if trace.step_numbers() != [2, 3, 4]:
        return [f"{name} holds the steps {trace.step_numbers()}, expected ProfilerStep#2, #3 and "
                "#4 (wait 1, warm-up 1, 3 active)"]  # fmt: skip
    problems = []
    for step in trace.steps:
        if not began - 5.0 <= step.ts / 1e6 <= ended + 5.0:
            problems.append(f"{name}'s {step.name} was not recorded while the judge ran the job")
            break
        inside = [e for e in trace.events if step.ts <= e.ts < step.end]
        reduces = [e for e in inside if e.name.startswith("gloo:all_reduce")]
        main = {e.name for e in inside if e.tid == trace.main_tid}
        if not reduces:
            problems.append(f"no all-reduces (gloo:all_reduce) recorded in {name}'s {step.name}: "
                            "did DDP's backward pass run inside the profiled step?")  # fmt: skip
        elif not all(e.args.get("Input Dims") for e in reduces):
            problems.append(f"no message shapes in {name}'s all-reduces (record_shapes=True)")
        elif sum(_message_bytes(e.args) for e in reduces) < 4 * MODEL_FLOATS:
            problems.append(f"the all-reduces of {name}'s {step.name} carry "
                            f"{sum(_message_bytes(e.args) for e in reduces)} bytes, less than "
                            f"the model's gradients ({4 * MODEL_FLOATS} bytes)")  # fmt: skip
        if not any(n.startswith("Optimizer.step") for n in main):
            problems.append(f"no optimizer step in {name}'s {step.name}")
        if not any("Backward" in n for n in main):
            problems.append(f"no backward pass in {name}'s {step.name}")
        if problems:
            break
    return problems


def check_profile(ctx: Context) -> None:
    worker = ctx.worker()
    trace_dir = Path(worker.folder) / f"traces-{ctx.seed % 100_000}"
    began = time.time()
    worker.probe(f"{_P}:probe_profile", trace_dir=str(trace_dir), steps=STEPS)
    ended = time.time()
    files = sorted(p.name for p in trace_dir.glob("rank*.json")) if trace_dir.is_dir() else []
    want = [f"rank{r}.json" for r in range(WORLD)]
    expect(files == want, f"trace files in the folder the judge passed as trace_dir ({WORLD} ranks)",
           expected=want, got=files)  # fmt: skip
    for rank in range(WORLD):
        problems = _trace_problems(trace_dir / f"rank{rank}.json", rank, began, ended)
        if problems:
            raise CheckFailed("; ".join(problems))
    from ddtk.profiling.trace import load_trace

    traces = [load_trace(trace_dir / f) for f in want]
    a, b = traces[0].steps[1], traces[1].steps[1]
    expect(min(a.end, b.end) > max(a.ts, b.ts), "ProfilerStep#3 of the two ranks on one clock",
           expected="overlapping windows (the ranks trained together)",
           got=f"rank 0 {a.ts / 1e6:.3f} s, rank 1 {b.ts / 1e6:.3f} s")  # fmt: skip


# ------------------------------------------------------------------ exercise 2

PARTS = ("compute", "data", "optimizer", "communication", "idle")


def _spans(rng: random.Random, lo: float, hi: float, n: int) -> list[tuple[float, float]]:
    """``n`` disjoint sorted spans (µs), some crossing the window's edges."""
    from ddtk.profiling.intervals import union

    margin = 0.2 * (hi - lo)
    points = sorted(round(rng.uniform(lo - margin, hi + margin), 1) for _ in range(2 * n))
    return union((points[i], points[i + 1]) for i in range(0, 2 * n, 2))


def step_cases(rng: random.Random) -> list[dict]:
    """Seeded steps: the four lanes of a rank and a window, as plain data."""
    cases = []
    for i in range(10):
        lo = round(rng.uniform(1e5, 1e7), 1)
        hi = round(lo + rng.uniform(500, 120_000), 1)
        comm = 0 if i == 0 else rng.randint(1, 4)
        case = {"lo": lo, "hi": hi,
                "data": _spans(rng, lo, hi, rng.randint(0, 2)),
                "optimizer": _spans(rng, lo, hi, rng.randint(0, 2)),
                "compute": _spans(rng, lo, hi, rng.randint(1, 6)),
                "comm": _spans(rng, lo, hi, comm)}  # fmt: skip
        if i == 1:  # everything in flight hidden behind compute
            case["comm"] = [(s + 0.25 * (e - s), e - 0.25 * (e - s)) for s, e in case["compute"]]
        if i == 2:  # whatever the seed: a fetch that began before the step, and an
            w = hi - lo  # optimizer step inside a compute span (each part counted once)
            case["data"] = [(round(lo - 0.1 * w, 1), round(lo + 0.1 * w, 1))]
            case["optimizer"] = [(round(lo + 0.5 * w, 1), round(lo + 0.6 * w, 1))]
            case["compute"] = [(round(lo + 0.3 * w, 1), round(lo + 0.8 * w, 1))]
        cases.append(case)
    return cases


def expected_step(case: dict) -> dict[str, float]:
    """The lab's definition of a step's parts (ms), by ddtk's breakdown of the same lanes."""
    from ddtk.profiling.breakdown import step_parts
    from ddtk.profiling.intervals import intersect, length, subtract, union

    # lanes() gives optimizer time without data time; step_parts relies on it
    ln = SimpleNamespace(on_device=False, data=case["data"], compute=case["compute"],
                         optimizer=subtract(case["optimizer"], case["data"]), comm=case["comm"])  # fmt: skip
    lo, hi = case["lo"], case["hi"]
    parts, comm = step_parts(ln, lo, hi)
    useful = union(parts["data"] + parts["optimizer"] + parts["compute"])
    exposed = parts["communication"]
    in_flight = length(comm)
    out = {k: length(parts[k]) / 1e3 for k in ("compute", "data", "optimizer", "communication")}
    out["idle"] = max((hi - lo) - length(useful) - length(exposed), 0.0) / 1e3
    out["in_flight"] = in_flight / 1e3
    out["overlap"] = length(intersect(comm, useful)) / in_flight if in_flight else 0.0
    return out


def _plain(value: Any) -> Any:
    """A number as a float (bools, ints, text and None kept), anything else as a short text."""
    import numbers

    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return value[:500]
    if isinstance(value, numbers.Real):
        return float(value)
    return repr(value)[:120]


def probe_steps(ns: dict[str, Any], cases: list[dict]) -> list[dict]:
    """``step_times`` on each seeded step; every value as plain data."""
    out = []
    for c in cases:
        ln = SimpleNamespace(data=list(c["data"]), optimizer=list(c["optimizer"]),
                             compute=list(c["compute"]), comm=list(c["comm"]))  # fmt: skip
        got = ns["step_times"](ln, c["lo"], c["hi"])
        out.append({str(k): _plain(v) for k, v in dict(got).items()})
    return out


def _near(got: Any, want: float, tol: float = 1e-6) -> bool:
    return isinstance(got, int | float) and not isinstance(got, bool) and abs(got - want) <= tol


def check_steps(ctx: Context) -> None:
    cases = step_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_steps", cases=cases)
    for case, mine in zip(cases, got):
        want = expected_step(case)
        what = f"step_times on a seeded step [{case['lo']}, {case['hi']}] µs"
        wrong = {k: mine.get(k, "missing") for k in want if not _near(mine.get(k), want[k])}
        expect(not wrong, what, expected={k: round(want[k], 6) for k in wrong},
               got={k: round(v, 6) if isinstance(v, float) else v for k, v in wrong.items()})  # fmt: skip
        total = sum(mine[k] for k in PARTS)
        expect(_near(total, (case["hi"] - case["lo"]) / 1e3), f"{what}: the parts' sum",
               expected="the step", got=total)  # fmt: skip


# ------------------------------------------------------------------ exercise 3


def breakdown_rows(rng: random.Random, world: int, steps: int, *, straggler: bool,
                   outlier: bool, messages: bool) -> list[dict]:  # fmt: skip
    """A seeded job's breakdown rows: one rank slower than all others every step
    (``straggler``), and (``outlier``) another with one step stretched so far that its
    mean busy time is the largest, though its median is not."""
    base = {r: rng.uniform(60, 95) for r in range(world)}
    slow = rng.randrange(world)
    if straggler:
        base[slow] = max(base.values()) * rng.uniform(1.3, 1.8)
    stretched = (rng.choice([r for r in range(world) if r != slow]), rng.randrange(steps))
    busy = {(r, s): base[r] + rng.uniform(-3, 3) for r in range(world) for s in range(steps)}
    if outlier:
        r0 = stretched[0]
        others = [busy[(r0, s)] for s in range(steps) if s != stretched[1]]
        top = max(statistics.fmean(busy[(r, s)] for s in range(steps)) for r in range(world))
        busy[stretched] = top * steps - sum(others) + rng.uniform(20, 60)  # its mean is the top
    rows = []
    for r in range(world):
        for s in range(steps):
            b, wait = busy[(r, s)], rng.uniform(2, 40)
            data, opt = rng.uniform(0, 0.4) * b, rng.uniform(0.5, 5)
            forwards = rng.choice([1, 2, 4, 8])
            count = rng.randint(1, 40) if messages else 0
            rows.append({
                "rank": r, "step": s + 2, "start_ms": 200.0 * s, "step_ms": b + wait,
                "compute_ms": b - data - opt, "communication_ms": wait, "data_ms": data,
                "optimizer_ms": opt, "idle_ms": 0.0, "comm_total_ms": wait + rng.uniform(0, 20),
                "overlap": rng.random(), "collectives": count,
                "comm_bytes": count * rng.randint(20_000, 3_000_000),
                "forwards": forwards, "synced_forwards": rng.randint(1, forwards),
                "fp32_matmul": rng.random(),
            })  # fmt: skip
    return rows


def expected_evidence(rows: list[dict]) -> dict[str, dict]:
    """The lab's definition of each bottleneck's evidence, over all ``rows``."""
    ranks = sorted({r["rank"] for r in rows})
    busy = {k: statistics.median(r["step_ms"] - r["communication_ms"] for r in rows if r["rank"] == k)
            for k in ranks}  # fmt: skip
    slowest = max(busy, key=busy.__getitem__)
    others = statistics.median(v for k, v in busy.items() if k != slowest)
    count = sum(r["collectives"] for r in rows)
    return {
        "straggler": {"rank": slowest, "ratio": busy[slowest] / others},
        "input": {"share": sum(r["data_ms"] for r in rows) / sum(r["step_ms"] for r in rows)},
        "small-messages": {"per_step": count / len(rows),
                           "bytes": sum(r["comm_bytes"] for r in rows) / count if count else 0.0},
        "sync-per-microbatch": {"synced": statistics.fmean(r["synced_forwards"] for r in rows),
                                "forwards": statistics.fmean(r["forwards"] for r in rows)},
        "precision": {"fp32_share": statistics.fmean(r["fp32_matmul"] for r in rows)},
    }  # fmt: skip


def probe_evidence(ns: dict[str, Any], cases: list[dict]) -> list[dict]:
    """``read_evidence`` on a :class:`Breakdown` of each case's rows; numbers as plain data."""
    from ddtk.profiling.breakdown import Breakdown, StepBreakdown

    out = []
    for case in cases:
        bd = Breakdown(
            rows=[StepBreakdown(**row) for row in case["rows"]], world_size=case["world"]
        )
        got = ns["read_evidence"](bd)
        out.append({str(kind): ({str(k): _plain(v) for k, v in dict(part).items()}
                                if isinstance(part, dict) else _plain(part))
                    for kind, part in dict(got).items()})  # fmt: skip
    return out


def check_evidence(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    cases = [
        {"world": 4, "what": "4 ranks, a straggler and one stretched step on another rank",
         "rows": breakdown_rows(rng, 4, 3, straggler=True, outlier=True, messages=True)},
        {"world": 5, "what": "5 ranks, a straggler",
         "rows": breakdown_rows(rng, 5, 4, straggler=True, outlier=False, messages=True)},
        {"world": 3, "what": "3 ranks, no straggler, one stretched step",
         "rows": breakdown_rows(rng, 3, 3, straggler=False, outlier=True, messages=True)},
        {"world": 2, "what": "2 ranks and no collective at all",
         "rows": breakdown_rows(rng, 2, 3, straggler=True, outlier=False, messages=False)},
    ]  # fmt: skip
    got = ctx.worker().probe(f"{_P}:probe_evidence",
                             cases=[{"world": c["world"], "rows": c["rows"]} for c in cases])  # fmt: skip
    for case, mine in zip(cases, got):
        for kind, part in expected_evidence(case["rows"]).items():
            for key, want in part.items():
                value = (
                    mine.get(kind, {}).get(key, "missing")
                    if isinstance(mine.get(kind), dict)
                    else "missing"
                )
                ok = value == want if key == "rank" else (
                    isinstance(value, int | float) and math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12))  # fmt: skip
                expect(ok, f"read_evidence of a seeded breakdown ({case['what']}): {kind}.{key}",
                       expected=round(want, 6), got=round(value, 6) if isinstance(value, float) else value)  # fmt: skip


# ------------------------------------------------------------------ exercise 4

LAB_RULES = {"straggler_ratio": 1.25, "input_share": 0.15, "min_messages": 6,
             "small_bytes": 1 << 20, "fp32_share": 0.5}  # fmt: skip
KINDS = ("straggler", "input", "small-messages", "sync-per-microbatch", "precision")


def seeded_rules(rng: random.Random) -> dict[str, float]:
    """Other thresholds than the lab's: an answer that wrote the lab's into its code fails."""
    return {"straggler_ratio": round(rng.uniform(1.4, 1.9), 2),
            "input_share": round(rng.uniform(0.25, 0.4), 2), "min_messages": rng.randint(12, 30),
            "small_bytes": rng.choice([256 << 10, 4 << 20]),
            "fp32_share": round(rng.uniform(0.7, 0.9), 2)}  # fmt: skip


def _evidence_for(rng: random.Random, rules: dict, hits: set[str], edge: bool) -> dict:
    """Evidence that shows exactly the bottlenecks ``hits`` under ``rules``; ``edge``: values
    exactly at a threshold (a hit: the rules say "at least") or just under it."""
    r = rules
    ratio = r["straggler_ratio"] * (1.0 if edge else rng.uniform(1.05, 1.6)) if "straggler" in hits \
        else r["straggler_ratio"] * (0.999 if edge else rng.uniform(0.7, 0.95))  # fmt: skip
    share = r["input_share"] * (1.0 if edge else rng.uniform(1.1, 2.0)) if "input" in hits \
        else r["input_share"] * (0.99 if edge else rng.uniform(0.05, 0.9))  # fmt: skip
    if "small-messages" in hits:
        per_step = r["min_messages"] if edge else r["min_messages"] + rng.randint(1, 40)
        size = round(r["small_bytes"] * rng.uniform(0.02, 0.9))
    else:  # too few messages, or large ones, or sizes unknown
        per_step, size = rng.choice([
            (r["min_messages"] - 1, round(r["small_bytes"] * 0.5)),
            (r["min_messages"] + rng.randint(0, 30), r["small_bytes"]),
            (r["min_messages"] + rng.randint(0, 30), 0.0),
        ])  # fmt: skip
    if "sync-per-microbatch" in hits:
        forwards = rng.choice([2, 4, 8])
        synced = forwards if not edge else rng.choice([1.5, 2.0])
    else:
        forwards, synced = rng.choice([(1.0, 1.0), (4.0, 1.0), (8.0, 1.0)])
    fp32 = r["fp32_share"] * (1.0 if edge else rng.uniform(1.0, 1 / r["fp32_share"])) if "precision" in hits \
        else r["fp32_share"] * (0.99 if edge else rng.uniform(0.0, 0.9))  # fmt: skip
    return {
        "straggler": {"rank": rng.randrange(8), "ratio": ratio},
        "input": {"share": share},
        "small-messages": {"per_step": float(per_step), "bytes": float(size)},
        "sync-per-microbatch": {"synced": float(synced), "forwards": float(forwards)},
        "precision": {"fp32_share": fp32},
    }  # fmt: skip


def expected_names(e: dict, rules: dict) -> set[str]:
    """The rules of the exercise applied to the evidence ``e``."""
    m, s = e["small-messages"], e["sync-per-microbatch"]
    hits = {
        "straggler": e["straggler"]["ratio"] >= rules["straggler_ratio"],
        "input": e["input"]["share"] >= rules["input_share"],
        "small-messages": m["per_step"] >= rules["min_messages"] and 0 < m["bytes"] < rules["small_bytes"],
        "sync-per-microbatch": s["forwards"] > 1 and s["synced"] > 1,
        "precision": e["precision"]["fp32_share"] >= rules["fp32_share"],
    }  # fmt: skip
    return {k for k, hit in hits.items() if hit}


def renderings(kind: str, e: dict) -> set[str]:
    """Ways a sentence may write the bottleneck's number (a ratio, a percentage, a size)."""

    def forms(v: float, *scales: float) -> set[str]:
        plain = {f"{v * s:.{d}f}" for s in scales for d in range(4)}
        return plain | {f"{v:.{d}%}".rstrip("%") for d in range(4)}

    if kind == "straggler":
        ratio = e["straggler"]["ratio"]
        return forms(ratio, 1, 100) | forms(ratio - 1, 100)
    if kind == "input":
        return forms(e["input"]["share"], 1, 100)
    if kind == "small-messages":
        m = e["small-messages"]
        return forms(m["per_step"], 1) | forms(m["bytes"], 1, 1 / 1024, 1 / 1e3, 1 / 2**20, 1 / 1e6)
    if kind == "sync-per-microbatch":
        return forms(e["sync-per-microbatch"]["synced"], 1) | forms(
            e["sync-per-microbatch"]["forwards"], 1
        )
    return forms(e["precision"]["fp32_share"], 1, 100)


def _states_number(sentence: str, kind: str, e: dict) -> bool:
    found = set(re.findall(r"\d+(?:\.\d+)?", sentence.replace(",", "")))
    return bool(found & renderings(kind, e))


def probe_names(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``name_bottlenecks`` on each case, under the case's ``RULES``."""
    out = []
    for case in cases:
        ns["RULES"] = dict(case["rules"])
        got = ns["name_bottlenecks"](json.loads(json.dumps(case["evidence"])))
        out.append({str(k): (v if isinstance(v, str) else _plain(v)) for k, v in dict(got).items()})
    return out


def check_names(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    cases = []
    for i in range(14):
        rules = LAB_RULES if i < 10 else seeded_rules(rng)
        hits = {k for k in KINDS if rng.random() < 0.5}
        if i in (0, 10):
            hits = set()
        elif i in (1, 11):
            hits = set(KINDS)
        cases.append({"rules": rules, "evidence": _evidence_for(rng, rules, hits, edge=i % 2 == 1)})
    got = ctx.worker().probe(f"{_P}:probe_names", cases=cases)
    for case, named in zip(cases, got):
        rules = case["rules"]
        want = expected_names(case["evidence"], rules)
        under = "the lab's RULES" if rules is LAB_RULES else f"RULES set to {rules}"
        what = f"name_bottlenecks on seeded evidence under {under}"
        expect(set(named) == want, what, expected=sorted(want), got=sorted(named))
        for kind, sentence in named.items():
            expect(isinstance(sentence, str) and _states_number(sentence, kind, case["evidence"]),
                   f"{what}: the sentence for {kind}",
                   expected=f"one that states its number ({kind}: {case['evidence'][kind]})",
                   got=sentence)  # fmt: skip


# ------------------------------------------------------------------ exercise 5

ROWS = {
    "straggler": {"straggler_ms", "straggler_rank"},
    "input": {"num_workers", "prefetch_factor"},
    "small-messages": {"bucket_cap_mb"},
    "sync-per-microbatch": {"no_sync"},
    "precision": {"precision"},
    "communication": {"comm_hook"},
}


def _fields(cfg: Any) -> dict[str, Any]:
    """A JobConfig as plain data (its fields), or its type's name when it is not one."""
    from ddtk.profiling.jobs import JobConfig

    if not isinstance(cfg, JobConfig):
        return {"(type)": type(cfg).__name__}
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def probe_fix(ns: dict[str, Any], configs: list[dict], inputs: list[tuple[int, float | None]],
              unknown: str) -> dict:  # fmt: skip
    """``fix`` for every kind on every configuration, the input fix with the judge's step
    times (None: the default), and the error an unknown kind raises."""
    from ddtk.profiling.jobs import JobConfig

    cfgs = [JobConfig(**c) for c in configs]
    kinds = {
        f"{i}:{kind}": _fields(ns["fix"](cfg, kind)) for i, cfg in enumerate(cfgs) for kind in ROWS
    }
    workers = []
    for i, step_ms in inputs:
        got = (
            ns["fix"](cfgs[i], "input")
            if step_ms is None
            else ns["fix"](cfgs[i], "input", step_ms=step_ms)
        )
        workers.append(_fields(got))
    try:
        ns["fix"](cfgs[0], unknown)
        error = {"type": None, "message": ""}
    except Exception as exc:  # the learner's code may raise anything; the type is the answer
        error = {"type": type(exc).__name__, "message": str(exc)[:500]}
    return {"kinds": kinds, "workers": workers, "error": error}


def fix_configs(rng: random.Random) -> list[dict]:
    """Seeded jobs: the lab's presets with other input work, batch sizes and workers."""
    from ddtk.profiling.jobs import JOBS

    out = [_fields(JOBS["slow"])]
    for name in rng.sample(sorted(JOBS), 3):
        cfg = JOBS[name].replace(data_ms=round(rng.uniform(20, 400), 1), num_workers=rng.choice([0, 0, 1]),
                                 straggler_rank=rng.choice([None, 0, -1]),
                                 straggler_ms=rng.choice([0.0, round(rng.uniform(10, 90), 1)]),
                                 seed=rng.randrange(1000))  # fmt: skip
        out.append(_fields(cfg))
    return out


def workers_needed(data_ms: float, step_ms: float) -> int:
    """Workers that together deliver a batch every step: each needs data_ms per batch."""
    return max(1, math.ceil(data_ms / step_ms - 1e-9))


def check_fix(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    configs = fix_configs(rng)
    # the slow job at the default 100 ms, short steps with much input work, long steps with little
    inputs = [(0, None), (1, round(rng.uniform(30, 60), 1)), (2, round(rng.uniform(140, 250), 1)),
              (3, round(rng.uniform(60, 90), 1))]  # fmt: skip
    configs[1]["data_ms"] = round(rng.uniform(4.2, 7.5) * inputs[1][1], 1)  # 5 to 8 workers
    unknown = (
        f"{rng.choice(['cosmic-rays', 'thermal', 'noisy-fan', 'gremlins'])}-{rng.randrange(1000)}"
    )
    got = ctx.worker().probe(f"{_P}:probe_fix", configs=configs, inputs=inputs, unknown=unknown)
    for i, cfg in enumerate(configs):
        for kind, row in ROWS.items():
            fixed = got["kinds"][f"{i}:{kind}"]
            what = f"fix(cfg, {kind!r}) on a seeded job ({cfg['description'] or 'the slow job'})"
            expect("(type)" not in fixed, what, expected="a JobConfig", got=fixed.get("(type)"))
            changed = sorted(k for k in cfg if fixed[k] != cfg[k])
            expect(set(changed) <= row, f"{what}: the fields it changes",
                   expected=f"only the row's fields, some of {sorted(row)}", got=changed)  # fmt: skip
            ok, want = {
                "straggler": (fixed["straggler_ms"] == 0 or fixed["straggler_rank"] is None, "no planted delay left"),
                "input": (fixed["num_workers"] >= 1, "data-loader workers (num_workers >= 1)"),
                "small-messages": (fixed["bucket_cap_mb"] >= LAB_RULES["small_bytes"] / 2**20,
                                   "buckets of at least 1 MB"),
                "sync-per-microbatch": (fixed["no_sync"] is True, "no_sync=True"),
                "precision": (fixed["precision"] == "bf16", "precision 'bf16'"),
                "communication": (fixed["comm_hook"] in ("fp16", "powersgd"), "'fp16' or 'powersgd' (gloo)"),
            }[kind]  # fmt: skip
            expect(ok, what, expected=want, got={k: fixed[k] for k in sorted(row)})
    for (i, step_ms), fixed in zip(inputs, got["workers"]):
        data = configs[i]["data_ms"]
        step = 100.0 if step_ms is None else step_ms
        need = workers_needed(data, step)
        call = "fix(cfg, 'input')" if step_ms is None else f"fix(cfg, 'input', step_ms={step_ms})"
        expect("(type)" not in fixed, call, expected="a JobConfig", got=fixed.get("(type)"))
        n = fixed["num_workers"]
        expect(n >= need, f"{call} for {data} ms of input work per batch: workers x {step} ms",
               expected=f"at least {data} ms: {need} or more workers (each worker takes {data} ms "
               "per batch; the loop wants one every step)", got=f"{n} workers")  # fmt: skip
        most = need + max(2, need)
        expect(n <= most, f"{call} for {data} ms of input work per batch",
               expected=f"not absurdly many workers: {need} keep up, at most {most}",
               got=f"{n} workers (each is a process with its own copy of the dataset)")  # fmt: skip
    error = got["error"]
    expect(error["type"] == "ValueError" and unknown in error["message"],
           f"fix(cfg, {unknown!r}), a kind with no fix", expected=f"a ValueError naming {unknown!r}",
           got=f"{error['type']}: {error['message']}" if error["type"] else "no error")  # fmt: skip


# ------------------------------------------------------------------ exercise 6

FIX_KINDS = (
    "straggler",
    "input",
    "small-messages",
    "sync-per-microbatch",
    "precision",
    "communication",
)
_LOW = 12  # the fixes live in the low bits of the seeded start's seed field


def probe_optimise(ns: dict[str, Any], scenarios: list[dict]) -> list[dict]:
    """``optimise`` with the judge's ``fix`` and ``measure`` (and ``min_gain``), for each
    scenario: what was measured, the rows it returned and the configuration it chose."""
    from ddtk.profiling.jobs import JobConfig

    out = []
    for sc in scenarios:
        bits, base = sc["bits"], sc["base"]
        calls: list[dict] = []

        def applied(cfg: Any, bits: dict = bits, base: int = base) -> Any:
            if not isinstance(cfg, JobConfig):
                return f"not a JobConfig ({type(cfg).__name__})"
            if cfg.seed >> _LOW != base >> _LOW:
                return "a configuration the judge never made"
            return sorted(k for k, b in bits.items() if cfg.seed & b)

        def fix(cfg: Any, kind: str, bits: dict = bits) -> Any:
            if kind not in bits:
                raise ValueError(f"no fix for {kind!r}")
            return cfg.replace(seed=cfg.seed | bits[kind])

        def measure(cfg: Any, label: str, sc: dict = sc, calls: list = calls) -> dict:
            got = applied(cfg)
            speed = (
                sc["speed"] * math.prod(sc["gains"][k] for k in got)
                if isinstance(got, list)
                else 1.0
            )
            calls.append({"applied": got, "label": str(label)})
            return {"samples_per_s": speed, "token": f"{sc['token']}-{len(calls)}"}

        ns.update(fix=fix, min_gain=sc["min_gain"])
        final, rows = ns["optimise"](JobConfig(seed=base), list(sc["kinds"]), measure)
        out.append({
            "calls": calls, "final": applied(final),
            "rows": [{"fix": _plain(dict(r).get("fix")), "kept": _plain(dict(r).get("kept")),
                      "token": _plain(dict(r).get("token"))} for r in list(rows)],
        })  # fmt: skip
    return out


def scenario(rng: random.Random, min_gain: float) -> dict:
    """Seeded throughputs for the six fixes, in blocks that tell each mistake apart: a clear
    gain; a loss and then a gain inside the noise floor; a gain between ``min_gain`` and
    5 %; a clear gain and then one inside the noise floor."""
    blocks = [["clear"], ["loss", "noise"], ["gap"], ["clear", "noise"]]
    rng.shuffle(blocks)
    types = [t for b in blocks for t in b]
    kinds = list(FIX_KINDS)
    rng.shuffle(kinds)
    lo, hi = sorted((min_gain, 0.05))
    gains = {}
    for kind, t in zip(kinds, types):
        gains[kind] = {
            "clear": lambda: rng.uniform(1.25, 1.9),
            "loss": lambda: rng.uniform(0.75, 0.95),
            "noise": lambda: 1 + min_gain * rng.uniform(0.2, 0.7),
            "gap": lambda: 1 + rng.uniform(lo + 0.25 * (hi - lo), hi - 0.25 * (hi - lo)),
        }[t]()
    offsets = rng.sample(range(_LOW), len(kinds))
    return {"kinds": kinds, "gains": gains, "min_gain": min_gain, "speed": rng.uniform(200, 2000),
            "bits": {k: 1 << o for k, o in zip(kinds, offsets)},
            "base": rng.randrange(1, 1 << 20) << _LOW, "token": f"{rng.getrandbits(48):012x}"}  # fmt: skip


def expected_run(sc: dict) -> dict:
    """What keep-or-revert gives on a scenario: the measured configurations, the kept flags."""
    current: list[str] = []
    best = sc["speed"]
    calls, kept = [{"applied": [], "label": "start"}], [True]
    for kind in sc["kinds"]:
        trial = sorted([*current, kind])
        speed = sc["speed"] * math.prod(sc["gains"][k] for k in trial)
        calls.append({"applied": trial, "label": None})
        kept.append(speed > best * (1 + sc["min_gain"]))
        if kept[-1]:
            current, best = trial, speed
    return {"calls": calls, "kept": kept, "final": current}


def check_optimise(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    gains = [rng.uniform(0.08, 0.15), rng.uniform(0.015, 0.035), rng.choice([0.1, 0.03])]
    scenarios = [scenario(rng, round(g, 3)) for g in gains]
    got = ctx.worker().probe(f"{_P}:probe_optimise", scenarios=scenarios)
    for sc, mine in zip(scenarios, got):
        want = expected_run(sc)
        what = (f"optimise on seeded measurements (min_gain={sc['min_gain']}, gains "
                + ", ".join(f"{k} {g - 1:+.1%}" for k, g in sc["gains"].items()) + ")")  # fmt: skip
        measured = [c["applied"] for c in mine["calls"]]
        planned = [c["applied"] for c in want["calls"]]
        for i, (a, b) in enumerate(
            zip([*planned, "no measurement"], [*measured, "no measurement"])
        ):
            expect(a == b, f"{what}: measurement {i + 1} (" + ("start" if i == 0 else
                   f"after trying {sc['kinds'][i - 1]!r}" if i <= len(sc["kinds"]) else "one too many") + ")",
                   expected=f"the start with {a} applied" if isinstance(a, list) else a,
                   got=f"the start with {b} applied" if isinstance(b, list) else b)  # fmt: skip
        expect(mine["calls"][0]["label"] == "start", f"{what}: the label of the first measurement",
               expected="'start'", got=mine["calls"][0]["label"])  # fmt: skip
        rows = mine["rows"]
        tokens = [f"{sc['token']}-{i}" for i in range(1, len(want["calls"]) + 1)]
        expect([r["token"] for r in rows] == tokens, f"{what}: the rows",
               expected="every measurement measure returned, in order, with fix and kept added",
               got=f"{len(rows)} rows, not those measure returned" if len(rows) != len(tokens)
               else "rows that are not the measurements measure returned")  # fmt: skip
        fixes = [r["fix"] for r in rows]
        expect(fixes == ["start", *sc["kinds"]], f"{what}: the fix of each row",
               expected=["start", *sc["kinds"]], got=fixes)  # fmt: skip
        kept = [r["kept"] for r in rows]
        expect(kept == want["kept"], f"{what}: which fixes were kept",
               expected=want["kept"], got=kept)  # fmt: skip
        expect(mine["final"] == want["final"], f"{what}: the configuration optimise returns",
               expected=f"the start with {want['final']} applied", got=mine["final"])  # fmt: skip


JUDGE = LabJudge(
    lab="lab04-profiling",
    setup=(("430bd83a", "all"), ("a699ff2c", "imports")),
    exercises={
        1: Exercise(1, "profile a DDP training loop on every rank", ("75451cf2",), check_profile,
                    _FORBID, _GIVEN),
        2: Exercise(2, "where each step's time went", ("4a51ad7b",), check_steps, _FORBID, _GIVEN),
        3: Exercise(3, "read the evidence", ("1f2ce6b5",), check_evidence, _FORBID, _GIVEN),
        4: Exercise(4, "name the bottlenecks", ("98d73259",), check_names, _FORBID, _GIVEN),
        5: Exercise(5, "one fix per bottleneck", ("65d95908",), check_fix, _FORBID, _GIVEN),
        6: Exercise(6, "measure, keep or revert", ("d0705fc0",), check_optimise, _FORBID, _GIVEN),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
