"""Lecture 02 (Ray): the judged exercises 1 to 3, without running Ray Tune.

The three exercises are the decisions Tune's schedulers and resource manager make, as
pure functions, so each check calls them once in a worker on seeded inputs and compares
with what the judge computes itself (see :mod:`ddtk.course.judging`); no cluster starts:

1. **ASHA rungs and promotion**: rungs for seeded grace periods, reduction factors and
   budgets (one budget landing exactly on a rung); promotion decisions on seeded rungs,
   including a loss exactly at the cut and losses between the cut and the median, and
   a seeded stream of results decided one by one against what was recorded before it,
   as ``ray.tune``'s ASHA does.
2. **PBT exploit and explore**: seeded populations (odd sizes, a quantile that would
   take more than half) with seeded perturbation factors that are not the notebook's;
   the judge checks which trials exploit, that each donor is in the top quantile, that
   each new learning rate is the donor's times one of the factors, that the inputs are
   left alone, and, over many seeded generators, that donors and factors really are
   drawn at random from the whole top quantile and from every factor.
3. **trials at once**: seeded clusters (nodes with CPUs, GPUs, memory and custom
   resources, some lacking a resource) and seeded bundles with fractional requests and
   caps, including a bundle that fits the cluster's total but no single node.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from ddtk.course.checks import expect
from ddtk.course.judges._data import plain
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
_TUNE = ("ray", "ddtk", "optuna", "hyperopt")


# ------------------------------------------------------------------ exercise 1


def probe_asha(ns: dict[str, Any], rungs: list[list[int]], decisions: list[list],
               streams: list[list]) -> dict:  # fmt: skip
    """``asha_rungs`` on each ``(grace, eta, max_t)``; ``asha_continues`` on each
    ``(recorded, loss, eta)`` and on each stream's results, each against those before it."""
    cont = ns["asha_continues"]
    return {
        "rungs": [plain(ns["asha_rungs"](*args)) for args in rungs],
        "decisions": [plain(cont(list(rec), loss, eta)) for rec, loss, eta in decisions],
        "streams": [[plain(cont(list(losses[:i]), x, eta)) for i, x in enumerate(losses)]
                    for losses, eta in streams],
    }  # fmt: skip


def reference_rungs(grace: int, eta: int, max_t: int) -> list[int]:
    """``grace * eta**k`` for every k with the result at most ``max_t``."""
    out, t = [], grace
    while t <= max_t:
        out.append(t)
        t *= eta
    return out


def reference_continues(recorded: list[float], loss: float, eta: int) -> bool:
    """ASHA's rule: continue when ``loss`` is within the best ``1/eta`` of the rung so far."""
    import numpy as np

    return not recorded or loss <= float(np.percentile(recorded, 100 / eta))


def asha_cases(rng: random.Random) -> tuple[list, list, list]:
    """Seeded rung budgets, single decisions (a tie at the cut, losses between the cut and
    the median) and streams of results arriving at one rung."""
    import numpy as np

    rungs = []
    for _ in range(4):
        grace, eta = rng.randint(1, 8), rng.randint(2, 5)
        rungs.append([grace, eta, rng.randint(grace, grace * eta**4)])
    grace, eta = rng.randint(1, 6), rng.randint(2, 4)
    rungs.append([grace, eta, grace * eta ** rng.randint(2, 4)])  # the budget is a rung
    rng.shuffle(rungs)
    decisions: list[list] = [[[], round(rng.uniform(0.5, 5), 3), rng.randint(2, 5)]]
    for _ in range(6):
        eta = rng.randint(2, 5)
        recorded = [round(rng.uniform(0.1, 3.0), 3) for _ in range(eta * rng.randint(1, 3) + 1)]
        cut, median = float(np.percentile(recorded, 100 / eta)), float(np.median(recorded))
        decisions.append([recorded, cut, eta])  # exactly at the cut: continues
        decisions.append([recorded, round(cut + (median - cut) * rng.uniform(0.2, 0.8), 6), eta])
        decisions.append([recorded, round(rng.uniform(0.05, 3.5), 3), eta])
    rng.shuffle(decisions)
    streams = [[[round(rng.uniform(0.05, 2.5), 3) for _ in range(rng.randint(8, 14))], eta]
               for eta in (rng.randint(2, 3), rng.randint(3, 5))]  # fmt: skip
    return rungs, decisions, streams


def check_asha(ctx: Context) -> None:
    rungs, decisions, streams = asha_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_asha", rungs=rungs, decisions=decisions, streams=streams)
    for (grace, eta, max_t), found in zip(rungs, got["rungs"]):
        want = reference_rungs(grace, eta, max_t)
        found = list(found) if isinstance(found, list | tuple) else found
        expect(found == want, f"asha_rungs(grace_period={grace}, reduction_factor={eta}, max_t={max_t}) "
               "(every grace_period * reduction_factor**k up to and including max_t)", expected=want, got=found)  # fmt: skip
    for (recorded, loss, eta), found in zip(decisions, got["decisions"]):
        want = reference_continues(recorded, loss, eta)
        expect(found is want or found == want,
               f"asha_continues: loss {loss} at a rung holding {recorded}, reduction_factor={eta} "
               f"(continue within the best 1/{eta}, the cut included; the first result always continues)",
               expected=want, got=found)  # fmt: skip
    for (losses, eta), found in zip(streams, got["streams"]):
        want = [reference_continues(losses[:i], x, eta) for i, x in enumerate(losses)]
        expect(found == want, f"decisions for seeded losses {losses} arriving at one rung "
               f"(reduction_factor={eta}), each judged against the results recorded before it",
               expected=want, got=found)  # fmt: skip


# ------------------------------------------------------------------ exercise 2


def probe_pbt(ns: dict[str, Any], cases: list[dict]) -> list[dict]:
    """``pbt_step`` on each case with ``random.Random(seed)`` for each of its seeds; the
    decisions and the inputs as they are after the call."""
    out = []
    for c in cases:
        losses, lrs = dict(c["losses"]), dict(c["lrs"])
        runs = []
        for seed in c["seeds"]:
            got = ns["pbt_step"](
                losses, lrs, c["quantile"], random.Random(seed), tuple(c["factors"])
            )
            runs.append(plain(got))
        out.append({"runs": runs, "losses": plain(losses), "lrs": plain(lrs)})
    return out


def pbt_cases(rng: random.Random) -> list[dict]:
    """Seeded populations, quantiles and factors (never the notebook's 0.8 and 1.2)."""
    cases = []
    for n, q in (
        (8, 0.25),
        (rng.choice([5, 7]), 0.5),
        (rng.choice([6, 9, 10]), rng.choice([0.2, 0.3, 0.4])),
        (12, 0.25),
    ):
        names = [f"trial_{i:03d}_{rng.randint(0, 99999):05d}" for i in range(n)]
        values = rng.sample(range(10, 10_000), n)
        factors = rng.choice([[0.5, 2.0], [0.7, 1.3], [0.6, 1.0, 1.5], [0.9, 1.1]])
        cases.append({"losses": {t: v / 1000 for t, v in zip(names, values)},
                      "lrs": {t: round(10 ** rng.uniform(-5, -1), 8) for t in names},
                      "quantile": q, "factors": factors,
                      "seeds": [rng.randrange(2**31) for _ in range(24 if n >= 8 else 3)]})  # fmt: skip
    return cases


def check_pbt(ctx: Context) -> None:
    cases = pbt_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_pbt", cases=cases)
    for case, found in zip(cases, got):
        losses, lrs, q, factors = case["losses"], case["lrs"], case["quantile"], case["factors"]
        ranked = sorted(losses, key=losses.get)
        k = min(math.ceil(len(ranked) * q), len(ranked) // 2)
        top, bottom = ranked[:k], sorted(ranked[len(ranked) - k :])
        where = f"a seeded population of {len(losses)} trials, quantile_fraction={q}, factors={tuple(factors)}"
        expect(found["losses"] == losses and found["lrs"] == lrs, f"{where}: the inputs are left as they were",
               expected="losses and lrs unchanged", got="changed")  # fmt: skip
        donors, used = set(), set()
        for decisions in found["runs"]:
            expect(isinstance(decisions, Mapping), f"{where}: what pbt_step returns",
                   expected="a dict of trial -> (donor, lr)", got=decisions)  # fmt: skip
            got_bottom = sorted(decisions) if isinstance(decisions, Mapping) else decisions
            expect(got_bottom == bottom, f"{where}: the trials that exploit are the bottom ceil(n*q) "
                   "(at most n/2) by loss, the highest losses", expected=bottom, got=got_bottom)  # fmt: skip
            for trial, pair in decisions.items():
                donor, lr = (
                    pair if isinstance(pair, list | tuple) and len(pair) == 2 else (pair, None)
                )
                expect(donor in top, f"{where}: {trial}'s donor comes from the top quantile",
                       expected=sorted(top), got=donor)  # fmt: skip
                options = [lrs[donor] * f for f in factors]
                match = [
                    f
                    for f, o in zip(factors, options)
                    if isinstance(lr, float) and math.isclose(lr, o)
                ]
                expect(match, f"{where}: {trial}'s new lr is its donor's ({lrs[donor]:.3g}) times one of the "
                       "factors given", expected=options, got=lr)  # fmt: skip
                donors.add(donor)
                used.add(match[0])
        if len(found["runs"]) >= 20:
            expect(donors == set(top), f"{where}: over {len(found['runs'])} seeded generators the donors are "
                   "drawn at random from the whole top quantile (rng.choice)", expected=sorted(top),
                   got=sorted(donors))  # fmt: skip
            expect(used == set(factors), f"{where}: over {len(found['runs'])} seeded generators every "
                   "perturbation factor given appears (rng.choice)", expected=factors, got=sorted(used))  # fmt: skip


# ------------------------------------------------------------------ exercise 3


def probe_concurrency(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``concurrent_trials`` on each case."""
    return [plain(ns["concurrent_trials"]([dict(n) for n in c["nodes"]], dict(c["bundle"]), c["cap"]))
            for c in cases]  # fmt: skip


def reference_trials(nodes: list[Mapping[str, float]], bundle: Mapping[str, float],
                     cap: int | None) -> int:  # fmt: skip
    """Trials of ``bundle`` placed at once: per node, as many whole bundles as it holds."""
    total = sum(
        min(math.floor(node.get(r, 0) / a) for r, a in bundle.items() if a > 0) for node in nodes
    )
    return total if cap is None else min(total, cap)


def concurrency_cases(rng: random.Random) -> list[dict]:
    """Seeded clusters and bundles, among them one that only the pooled total would hold."""

    def node() -> dict:
        out = {
            "CPU": float(rng.choice([2, 4, 6, 8, 16, 32, 48, 64])),
            "memory": float(rng.choice([8, 16, 64]) * 2**30),
        }
        if rng.random() < 0.6:
            out["GPU"] = float(rng.choice([1, 2, 4, 8]))
        if rng.random() < 0.3:
            out["accelerator_type:A100"] = 1.0
        return out

    cases = []
    for i in range(8):
        nodes = [node() for _ in range(rng.randint(1, 5))]
        bundle = {"CPU": rng.choice([0.5, 1, 2, 3, 4, 8])}
        if rng.random() < 0.6 or i == 0:
            bundle["GPU"] = rng.choice([0.25, 0.5, 1, 2])
        if rng.random() < 0.3:
            bundle["memory"] = float(rng.choice([1, 2, 4]) * 2**30)
        if i == 1:
            bundle["accelerator_type:A100"] = 0.01
        cap = rng.choice([None, None, rng.randint(1, 6)])
        cases.append({"nodes": nodes, "bundle": bundle, "cap": cap})
    cpus = rng.choice([4, 6, 8])  # fits the pooled CPUs, no single node
    cases.append({"nodes": [{"CPU": float(cpus)}, {"CPU": float(cpus)}],
                  "bundle": {"CPU": cpus + rng.choice([1, 2])}, "cap": None})  # fmt: skip
    cases.append({"nodes": [{"CPU": 8.0}] + [{"CPU": 32.0, "GPU": 8.0}] * rng.randint(1, 3),
                  "bundle": {"CPU": 2, "GPU": 1}, "cap": rng.randint(2, 5)})  # fmt: skip
    rng.shuffle(cases)
    return cases


def check_concurrency(ctx: Context) -> None:
    cases = concurrency_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_concurrency", cases=cases)
    for case, found in zip(cases, got):
        want = reference_trials(case["nodes"], case["bundle"], case["cap"])
        shape = " + ".join(str(n) for n in case["nodes"])
        expect(found == want, f"bundle {case['bundle']} on seeded nodes {shape}, cap {case['cap']} "
               "(a bundle never spans nodes; every resource it asks for counts)", expected=want, got=found)  # fmt: skip


JUDGE = LabJudge(
    lab="02-ray",
    setup=(),
    exercises={
        1: Exercise(1, "ASHA rungs and promotion", ("code-ex_asha",), check_asha, _TUNE),
        2: Exercise(2, "PBT exploit and explore", ("code-ex_pbt",), check_pbt, _TUNE),
        3: Exercise(3, "trials at once", ("code-ex_concurrency",), check_concurrency, _TUNE),
    },
)


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
