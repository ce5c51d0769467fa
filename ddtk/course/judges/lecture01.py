"""Lecture 01 (distributed fundamentals): the judged exercise 1, choose a parallelism.

The check calls ``choose_parallelism`` once in a worker (see
:mod:`ddtk.course.judging`) on seeded models (layers, hidden size, heads, sequence
length, micro-batch, vocabulary) and seeded clusters (GPU counts, GPUs per node,
memory per GPU) the notebook never used, chosen so that every kind of answer occurs:
plain data parallelism, a ZeRO stage, tensor parallelism inside a node, pipeline
stages, and a model that fits nowhere. The judge computes the simplest layout that
fits with the lecture's own memory model (``ddtk.memory.calculator.estimate``) in its
own process, and says which rule a wrong layout breaks: GPUs unused, TP across nodes,
over the memory budget, or a simpler layout that also fits.
"""

from __future__ import annotations

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


JUDGE = LabJudge(
    lab="01-distributed-fundamentals",
    setup=(),
    exercises={
        1: Exercise(1, "choose a parallelism", ("70a5bfb7",), check_choose,
                    ("ddtk.memory", "ddtk.parallel", "ddtk.frameworks"), _GIVEN),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
