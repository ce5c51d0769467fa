"""Lecture 03 (Horovod and DDP): the judged exercise 1, a DeepSpeed config.

The check calls ``deepspeed_config`` once in a worker (see :mod:`ddtk.course.judging`)
on seeded model sizes, world sizes, memory budgets and micro-batch sizes the notebook
never used, chosen so that every kind of answer occurs: ZeRO stage 0, 1, 2 and 3,
stage 3 with the optimizer offloaded, a small world where offloading must come with a
ZeRO stage, and a model that fits nowhere. The judge computes the lowest choice that
fits with the ZeRO memory formula (``ddtk.parallel.zero.zero_memory_per_param``) in
its own process, and checks the config's keys, micro-batch and bf16 too.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ddtk.course.checks import expect
from ddtk.course.judges._data import outcome
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "optimizer", "scheduler", "bf16", "fp16", "gradient_clipping", "zero_optimization"}  # fmt: skip
_ZERO = {"stage", "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size",
         "reduce_scatter", "offload_optimizer", "offload_param"}  # fmt: skip
# The lecture's order: no offload before offload (PCIe traffic), then the lowest stage.
_ORDER = [(s, False) for s in range(4)] + [(s, True) for s in range(1, 4)]


def probe_config(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``deepspeed_config`` on each case; ``"ValueError"`` where it raises one."""
    fn = ns["deepspeed_config"]
    return [outcome(lambda c=c: fn(c["n_params"], c["world"], c["gib"], micro_batch=c["micro"]))
            for c in cases]  # fmt: skip


def on_gpu_gib(stage: int, offload: bool, n_params: float, world: int) -> float:
    """GiB of model states per GPU at ``stage``, the optimizer state offloaded or not."""
    from ddtk.parallel.zero import zero_memory_per_param

    per = zero_memory_per_param(stage, world)
    return (per["total"] - (per["optimizer_state"] if offload else 0)) * n_params / 2**30


def lowest(case: Mapping[str, Any]) -> tuple[int, bool] | str:
    """The first ``(stage, offload)`` of the lecture's order that fits, or ``"ValueError"``."""
    fits = [c for c in _ORDER if on_gpu_gib(*c, case["n_params"], case["world"]) <= case["gib"]]
    return fits[0] if fits else "ValueError"


def _kind(case: Mapping[str, Any]) -> str:
    answer = lowest(case)
    if isinstance(answer, str):
        return "nothing fits"
    stage, offload = answer
    if offload and on_gpu_gib(0, True, case["n_params"], case["world"]) <= case["gib"]:
        return "offload where stage 0 would also fit offloaded"
    return f"stage {stage}" + (" + offload" if offload else "")


def config_cases(rng: random.Random) -> list[dict]:
    """Seeded cases, one of each kind of answer."""
    wanted = {"nothing fits", "stage 0", "stage 1", "stage 2", "stage 3", "stage 3 + offload",
              "offload where stage 0 would also fit offloaded"}  # fmt: skip
    cases = []
    for _ in range(3000):
        case = {"n_params": round(rng.uniform(0.1, 200), 2) * 1e9, "world": rng.choice([1, 2, 3, 4, 8, 16, 32, 64]),
                "gib": rng.choice([12, 16, 24, 40, 48, 80]), "micro": rng.choice([1, 2, 3, 6, 8, 16, 32])}  # fmt: skip
        k = _kind(case)
        if k in wanted:
            wanted.discard(k)
            cases.append(case)
        if not wanted:
            break
    rng.shuffle(cases)
    return cases


def _zero_of(config: Any) -> tuple[int, bool] | None:
    """``(stage, offloaded to the CPU)`` of a config, or None when it has no valid stage."""
    zero = config.get("zero_optimization") if isinstance(config, Mapping) else None
    if not isinstance(zero, Mapping) or zero.get("stage") not in (0, 1, 2, 3):
        return None
    offload = zero.get("offload_optimizer")
    return zero["stage"], isinstance(offload, Mapping) and offload.get("device") == "cpu"


def check_config(ctx: Context) -> None:
    cases = config_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_config", cases=cases)
    for case, cfg in zip(cases, got):
        want = lowest(case)
        where = (f"{case['n_params'] / 1e9:g}B parameters on {case['world']} GPUs, {case['gib']} GiB each "
                 f"for model states, micro-batch {case['micro']} (a seeded case)")  # fmt: skip
        if want == "ValueError":
            expect(cfg == "ValueError", f"{where}: nothing fits, even with ZeRO-3 and the optimizer offloaded",
                   expected="ValueError", got=cfg)  # fmt: skip
            continue
        label = {
            (s, o): f"stage {s}" + (" with the optimizer offloaded" if o else "") for s, o in _ORDER
        }
        expect(cfg != "ValueError", f"{where}: {label[want]} fits, yet deepspeed_config raised ValueError",
               expected=label[want], got=cfg)  # fmt: skip
        expect(isinstance(cfg, Mapping) and set(cfg) <= _TOP, f"{where}: a config of top-level keys DeepSpeed knows",
               expected=sorted(_TOP), got=sorted(cfg) if isinstance(cfg, Mapping) else cfg)  # fmt: skip
        expect(cfg.get("train_micro_batch_size_per_gpu") == case["micro"], f"{where}: train_micro_batch_size_per_gpu",
               expected=case["micro"], got=cfg.get("train_micro_batch_size_per_gpu"))  # fmt: skip
        bf16 = cfg.get("bf16")
        expect(isinstance(bf16, Mapping) and bf16.get("enabled") is True, f"{where}: bf16 on",
               expected={"enabled": True}, got=bf16)  # fmt: skip
        zero = cfg.get("zero_optimization")
        expect(isinstance(zero, Mapping) and set(zero) <= _ZERO, f"{where}: zero_optimization of keys DeepSpeed knows",
               expected=sorted(_ZERO), got=zero)  # fmt: skip
        mine = _zero_of(cfg)
        expect(mine is not None and mine != (0, True), f"{where}: a ZeRO stage (offloading needs stage 1 or more)",
               expected=label[want], got=zero)  # fmt: skip
        used = on_gpu_gib(*mine, case["n_params"], case["world"])
        expect(used <= case["gib"], f"{where}: {zero} leaves {used:.1f} GiB of model states per GPU",
               expected=f"<= {case['gib']} GiB ({label[want]})", got=f"{used:.1f} GiB")  # fmt: skip
        expect(mine == want, f"{where}: a lower choice already fits, with less communication or no "
               "offload traffic", expected=label[want], got=label.get(mine, zero))  # fmt: skip


JUDGE = LabJudge(
    lab="03-horovod-and-ddp",
    setup=(),
    exercises={
        1: Exercise(1, "DeepSpeed config", ("l03-ex1",), check_config,
                    ("ddtk.parallel", "ddtk.frameworks", "ddtk.examples", "deepspeed"),
                    ("ddtk.parallel.zero.zero_memory_per_param",)),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
