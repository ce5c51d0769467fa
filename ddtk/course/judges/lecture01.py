"""Lecture 01 (distributed fundamentals): the judged exercises 1 and 2.

Each check calls the learner's function once in a worker (see
:mod:`ddtk.course.judging`) on seeded inputs the notebook never used, and compares
with what the judge computes in its own process:

1. **choose a parallelism**: ``choose_parallelism`` on seeded models (layers, hidden
   size, heads, sequence length, micro-batch, vocabulary) and seeded clusters (GPU
   counts, GPUs per node, memory per GPU), chosen so that every kind of answer occurs:
   plain data parallelism, a ZeRO stage, tensor parallelism inside a node, pipeline
   stages, and a model that fits nowhere. The judge computes the simplest layout that
   fits with the lecture's own memory model (``ddtk.memory.calculator.estimate``) and
   says which rule a wrong layout breaks: GPUs unused, TP across nodes, over the
   memory budget, or a simpler layout that also fits.
2. **size the run**: ``size_the_run`` on seeded models, token multipliers, peaks,
   MFUs, GPU counts and prices (an MFU of exactly 1 and a single GPU among them), and
   on inputs it must refuse (an MFU given as a percentage, 0 or above 1, no
   parameters, no GPUs). The judge sizes each run with ``ddtk.profiling.mfu.size_run``
   and names the usual slip behind a wrong number: 2·N·D, MFU applied the wrong way,
   seconds for hours, TFLOP/s for FLOP/s, days not spread over the GPUs.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Mapping
from typing import Any

from ddtk.course.checks import CheckFailed
from ddtk.course.judges._data import outcome
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
_GIVEN = ("ddtk.memory.calculator.TransformerConfig", "ddtk.memory.calculator.estimate")
_KEYS = ("layers", "hidden", "heads", "seq_len", "micro_batch", "vocab")


def probe_choose(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``choose_parallelism`` on each case's model (a mixed-precision TransformerConfig)
    and cluster; ``"ValueError"`` where it raises one."""
    from ddtk.memory.calculator import TransformerConfig

    out = []
    for c in cases:
        cfg = TransformerConfig(**{k: c[k] for k in _KEYS}, mixed_precision=True)
        out.append(
            outcome(
                lambda cfg=cfg, c=c: ns["choose_parallelism"](cfg, c["gpus"], c["gpn"], c["gib"])
            )
        )
    return out


def _config(case: Mapping[str, Any]) -> Any:
    from ddtk.memory.calculator import TransformerConfig

    return TransformerConfig(**{k: case[k] for k in _KEYS}, mixed_precision=True)


def _gib(case: Mapping[str, Any], layout: Mapping[str, int]) -> float:
    from ddtk.memory.calculator import estimate

    return estimate(_config(case), **layout, recompute=True).total / 2**30


def layouts(case: Mapping[str, Any]) -> list[dict[str, int]]:
    """Every layout of the case's GPUs in the lecture's order: fewest pipeline stages,
    then the smallest TP degree (inside a node, dividing the heads), then ZeRO stage."""
    gpus, gpn, cfg = case["gpus"], case["gpn"], _config(case)
    out = []
    for pp in (p for p in range(1, cfg.layers + 1) if gpus % p == 0):
        for tp in (t for t in range(1, gpn + 1) if gpus % (t * pp) == 0 and cfg.heads % t == 0):
            dp = gpus // (tp * pp)
            out += [
                {"dp": dp, "tp": tp, "pp": pp, "zero": z}
                for z in ((0, 1, 2, 3) if dp > 1 else (0,))
            ]
    return out


def simplest(case: Mapping[str, Any], tp_first: bool = False) -> dict[str, int] | str:
    """The first layout in the lecture's order that fits, or ``"ValueError"``; with
    ``tp_first``, in the order that prefers pipeline stages to TP (not the lecture's)."""
    order = layouts(case)
    if tp_first:
        order.sort(key=lambda lay: (lay["tp"], lay["pp"], lay["zero"]))
    return next((lay for lay in order if _gib(case, lay) <= case["gib"]), "ValueError")


def kind(answer: Mapping[str, int] | str) -> str:
    """Which rule decided ``answer``: nothing fits, pipeline, TP, ZeRO or plain DP."""
    if isinstance(answer, str):
        return "nothing fits"
    if answer["pp"] > 1:
        return "pipeline"
    return "tp" if answer["tp"] > 1 else "zero" if answer["zero"] else "dp"


def choose_cases(rng: random.Random) -> list[dict]:
    """Seeded models and clusters, one of each kind of answer, one where TP must stay
    inside a node to be right, one where TP must come before pipeline stages, and two
    more at random."""
    wanted = {"nothing fits", "pipeline", "tp", "zero", "dp", "node", "order"}
    cases, extra = [], []
    for _ in range(2000):
        hidden = rng.choice([1024, 2048, 3072, 4096, 5120, 6144, 8192])
        case = {"layers": rng.choice([12, 24, 32, 40, 48, 60, 80]), "hidden": hidden,
                "heads": hidden // rng.choice([64, 128]), "seq_len": rng.choice([1024, 2048, 4096, 8192]),
                "micro_batch": rng.choice([1, 2, 4]), "vocab": rng.choice([32000, 50304, 128256]),
                "gpus": rng.choice([4, 8, 16, 24, 32, 64]), "gpn": rng.choice([4, 8]),
                "gib": rng.choice([16, 24, 40, 48, 80])}  # fmt: skip
        want = simplest(case)
        hits = {kind(want)} & wanted
        if "node" in wanted and simplest(case | {"gpn": case["gpus"]}) != want:
            hits.add("node")
        if "order" in wanted and simplest(case, tp_first=True) != want:
            hits.add("order")
        if hits:
            wanted -= hits
            cases.append(case)
        elif len(extra) < 2:
            extra.append(case)
        if not wanted:
            break
    cases += extra
    rng.shuffle(cases)
    return cases


def _why(case: Mapping[str, Any], got: Any, want: Any) -> str:
    """The rule ``got`` breaks, in a sentence: the layout's own faults first, then what
    the judge's answer shows."""
    if got == "ValueError":
        return f"{want} fits ({_gib(case, want):.1f} GiB per GPU), but it raised ValueError"
    if not isinstance(got, Mapping) or set(got) != {"dp", "tp", "pp", "zero"}:
        return 'the layout is a dict with keys "dp", "tp", "pp", "zero"'
    if got["dp"] * got["tp"] * got["pp"] != case["gpus"]:
        return f"dp x tp x pp is {got['dp'] * got['tp'] * got['pp']}, not the {case['gpus']} GPUs"
    if got["tp"] > case["gpn"]:
        return f"TP {got['tp']} crosses nodes of {case['gpn']} GPUs (its all-reduces leave NVLink)"
    if got not in layouts(case):
        return "not a valid layout (TP must divide the heads, ZeRO 0 to 3 and only over DP ranks)"
    used = _gib(case, got)
    if used > case["gib"]:
        return f"it needs {used:.1f} GiB per GPU, over the {case['gib']} GiB"
    if want == "ValueError":  # not reached: a valid layout that fits is an answer
        return "nothing fits, so choose_parallelism should raise ValueError"
    return f"the simpler {want} also fits ({_gib(case, want):.1f} GiB) and communicates less"


def check_choose(ctx: Context) -> None:
    cases = choose_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_choose", cases=cases)
    for case, found in zip(cases, got):
        want = simplest(case)
        where = (f"a seeded model ({case['layers']} layers, hidden {case['hidden']}, {case['heads']} heads, "
                 f"sequence {case['seq_len']}, micro-batch {case['micro_batch']}) on {case['gpus']} GPUs of "
                 f"{case['gib']} GiB, {case['gpn']} per node")  # fmt: skip
        if found != want:
            raise CheckFailed(f"choose_parallelism for {where}: {_why(case, found, want)}: "
                              f"expected {want}, got {found}")  # fmt: skip


# ------------------------------------------------------------------ exercise 2

SIZE_KEYS = ("tokens", "flops", "gpu_hours", "days", "cost_usd")


def probe_size(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``size_the_run(**case)`` for each case; ``"ValueError"`` where it raises one."""
    return [outcome(lambda c=c: ns["size_the_run"](**c)) for c in cases]


def describe(case: Mapping[str, Any]) -> str:
    """The call's arguments, as a learner would write them."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v!r}" for k, v in case.items())


def _near(ratio: float, target: float) -> bool:
    return math.isclose(ratio, target, rel_tol=1e-3)


def _slip(key: str, ratio: float, case: Mapping[str, Any]) -> str:
    """The usual mistake that makes ``key`` come out ``ratio`` times the right value."""
    mfu, gpus = case["mfu"], case["gpus"]
    hints = {
        "tokens": [(20 / case["tokens_per_param"], "tokens_per_param ignored: tokens are "
                                                    "tokens_per_param × params"),
                   (1 / case["tokens_per_param"], "tokens are tokens_per_param × params")],
        "flops": [(1 / 3, "2·N·D counts the forward pass only; backward adds 4·N·D, so C = 6·N·D"),
                  (1 / 6, "C = 6·N·D: 6 FLOPs per parameter and token")],
        "gpu_hours": [(3600.0, "those are GPU-seconds: divide by 3,600"),
                      (mfu * mfu, "MFU applied the wrong way: the achieved rate is peak × MFU, "
                                  "so divide the FLOPs by it"),
                      (mfu, "MFU left out: the achieved rate is peak × MFU"),
                      (1e12, "peak_tflops is in TFLOP/s: multiply it by 1e12"),
                      (1 / gpus, "GPU-hours count every GPU: do not divide them by gpus")],
        "days": [(24.0, "those are hours: divide by 24"),
                 (float(gpus), "spread the GPU-hours over the gpus"),
                 (24.0 * gpus, "those are GPU-hours: divide by 24·gpus")],
        "cost_usd": [(float(gpus), "GPU-hours already count every GPU: cost = GPU-hours × price"),
                     (1 / gpus, "the price is per GPU-hour: multiply GPU-hours, not wall-clock hours"),
                     (1 / (24 * gpus), "cost = GPU-hours × price, not days × price")],
    }  # fmt: skip
    return next((f" ({why})" for r, why in hints.get(key, []) if _near(ratio, r)), "")


def expect_sized(case: Mapping[str, Any], got: Any) -> None:
    """Raise :class:`CheckFailed` unless ``got`` is what ``size_run`` gives for ``case``,
    naming the first wrong number and the usual slip behind it."""
    from ddtk.profiling.mfu import size_run

    want = size_run(**case).as_dict()
    call = f"size_the_run({describe(case)})"
    if got == "ValueError":
        raise CheckFailed(f"{call} raised ValueError on valid inputs (an MFU of 1 and a single "
                          "GPU are allowed)")  # fmt: skip
    if not isinstance(got, Mapping) or set(got) != set(SIZE_KEYS):
        raise CheckFailed(f"{call}: expected a dict with keys {', '.join(SIZE_KEYS)}, "
                          f"got {str(got)[:200]}")  # fmt: skip
    for key in SIZE_KEYS:
        value = got[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise CheckFailed(f"{call}: {key}: expected a number, got {value!r:.200}")
        if not math.isclose(value, want[key], rel_tol=1e-6):
            hint = _slip(key, value / want[key], case) if want[key] else ""
            raise CheckFailed(f"{call}: {key}{hint}: expected {want[key]:.6g}, got {value:.6g}")


def refusal(case: Mapping[str, Any]) -> str | None:
    """Why ``size_the_run`` must refuse ``case`` (params, gpus, mfu), or None."""
    if case["params"] <= 0:
        return f"{case['params']:g} parameters is not a model"
    if case["gpus"] < 1:
        return f"{case['gpus']} GPUs is not a cluster"
    if not 0 < case["mfu"] <= 1:
        # a whole number of percent is the usual slip; 1.05 is a fraction just too high
        hint = f" ({case['mfu']:g}% is {case['mfu'] / 100:g})" if case["mfu"] >= 2 else ""
        return f"an MFU of {case['mfu']:g} is outside (0, 1]{hint}"
    return None


def size_cases(rng: random.Random) -> list[dict]:
    """Seeded runs: five at random, one at an MFU of exactly 1 on a single GPU, and seven
    that must be refused; shuffled together."""

    def run() -> dict:
        return {"params": float(f"{10 ** rng.uniform(8, 12.3):.3g}"),
                "tokens_per_param": rng.choice([5, 10, 20, 37, 100, 300, round(rng.uniform(2, 400), 1)]),
                "peak_tflops": rng.choice([156, 312, 495, 989, round(rng.uniform(50, 2500), 1)]),
                "mfu": round(rng.uniform(0.12, 0.7), 3),
                "gpus": rng.choice([8, 96, 256, 1000, 2048, 6144, 16384]),
                "usd_per_gpu_hour": round(rng.uniform(0.8, 9.0), 2)}  # fmt: skip

    cases = [run() for _ in range(5)]
    cases.append(run() | {"mfu": 1.0, "gpus": 1})
    for change in ({"mfu": float(rng.randint(20, 60))}, {"mfu": 0.0}, {"mfu": -0.25},
                   {"mfu": 1.05}, {"params": 0.0}, {"params": -7e9}, {"gpus": 0}):  # fmt: skip
        cases.append(run() | change)
    rng.shuffle(cases)
    return cases


def check_size(ctx: Context) -> None:
    cases = size_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_size", cases=cases)
    for case, found in zip(cases, got):
        why = refusal(case)
        if why is None:
            expect_sized(case, found)
        elif found != "ValueError":
            raise CheckFailed(f"size_the_run({describe(case)}): {why}, so it must raise "
                              f"ValueError; got {str(found)[:200]}")  # fmt: skip


JUDGE = LabJudge(
    lab="01-distributed-fundamentals",
    setup=(),
    exercises={
        1: Exercise(1, "choose a parallelism", ("70a5bfb7",), check_choose,
                    ("ddtk.memory", "ddtk.parallel", "ddtk.frameworks"), _GIVEN),
        2: Exercise(2, "size the run", ("l01-size",), check_size, ("ddtk.profiling",)),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "describe", "expect_sized", "judge", "refusal"]
