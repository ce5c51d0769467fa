"""Sweep Horovod's two scheduling knobs, cycle time and fusion threshold, with few job starts.

Horovod's background thread wakes up every ``HOROVOD_CYCLE_TIME`` milliseconds,
agrees with the other ranks on which tensors are ready everywhere, and packs
ready tensors into one fusion buffer of up to ``HOROVOD_FUSION_THRESHOLD`` bytes
(128 MiB by default since Horovod 0.21, PR #2468; its tensor-fusion page still
says 64 MB), so that many small gradients travel as one all-reduce.
Both variables are read by ``hvd.init()``, so this entry point re-initialises
Horovod once per cycle time (``hvd.shutdown()`` then ``hvd.init()``) and times
each in the same processes, on the same model and data.

One limitation, measured with Horovod 0.28.1 and Gloo: once
``HOROVOD_FUSION_THRESHOLD`` is set at all, a second ``hvd.init()`` in the
process dies with SIGSEGV. So a job with an explicit ``--fusion`` measures one
cycle time, and :func:`run_sweep` starts one job per explicit threshold beside
the job that sweeps the cycle times at the default threshold.

Run under ``horovodrun`` (rank 0 prints the rows and writes the JSON)::

    horovodrun --gloo -np 2 -H localhost:2 python -m ddtk.frameworks.horovod_knobs \\
        --cycle 5,1,0.1 --steps 30 --json knobs.json --trace /tmp/timeline.json
    horovodrun --gloo -np 2 -H localhost:2 python -m ddtk.frameworks.horovod_knobs \\
        --fusion 0 --cycle 5 --steps 30 --json knobs-f0.json --trace /tmp/timeline-f0.json

With ``--trace PATH`` the first setting of the job also records a Horovod
timeline (Horovod opens one per process, at the first init), and
:mod:`ddtk.frameworks.horovod_timeline` counts the all-reduce *responses* per
step in it: one per fused group of tensors.

>>> job_plan([None, 0], [5.0, 1.0])
[(None, [5.0, 1.0]), (0, [5.0])]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

__all__ = ["DEFAULT_FUSION_BYTES", "job_plan", "main", "run_sweep"]

DEFAULT_FUSION_BYTES = 128 * 2**20  # HOROVOD_FUSION_THRESHOLD default since 0.21 (PR #2468)


def job_plan(fusions: list[int | None], cycles: list[float]) -> list[tuple[int | None, list[float]]]:
    """The horovodrun jobs a sweep needs: (fusion threshold or None = default, cycle times).

    The default threshold sweeps every cycle time in one job; an explicit one gets
    a job of its own with the first cycle time (see the module docstring for why).
    """
    return [(f, list(cycles) if f is None else [cycles[0]]) for f in fusions]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fusion", type=int, default=None, help="fusion threshold in bytes (default: Horovod's)")
    p.add_argument("--cycle", default="1,5", help="cycle times in ms, comma-separated")
    p.add_argument("--steps", type=int, default=30, help="timed steps per setting")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per setting")
    p.add_argument("--layers", type=int, default=16, help="Linear layers: 2 gradient tensors each")
    p.add_argument("--width", type=int, default=128, help="features per Linear layer")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--trace", default=None, help="record the first setting's timeline here")
    p.add_argument("--json", default=None, help="rank 0 writes the rows here")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.layers < 1:
        p.error("--steps and --layers must be >= 1, --warmup >= 0")
    if args.fusion is not None and "," in args.cycle:
        p.error("with --fusion, one --cycle per job: Horovod 0.28 crashes re-initialising then")
    return args


def _init(hvd, fusion: int | None, cycle: float, timeline: str | None) -> None:
    """``hvd.init()`` with this setting; the variables are read at init, hence the re-init per setting."""
    if fusion is not None:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(fusion)
    os.environ["HOROVOD_CYCLE_TIME"] = str(cycle)
    if timeline:
        os.environ["HOROVOD_TIMELINE"] = timeline
    else:
        os.environ.pop("HOROVOD_TIMELINE", None)
    hvd.init()


def _measure(
    hvd, args: argparse.Namespace, fusion: int | None, cycle: float, timeline: str | None
) -> dict:
    """Initialise Horovod with one setting, time ``args.steps`` steps, shut down.

    ``timeline`` is only honoured at the first initialisation of a process:
    Horovod 0.28 opens the timeline file once per process, and here it crashed
    (SIGSEGV) when a timeline was switched on at a later re-initialisation, or by
    ``hvd.start_timeline`` after one.
    """
    import torch

    _init(hvd, fusion, cycle, timeline)
    # A fresh model per initialisation: DistributedOptimizer hooks the parameters'
    # gradient accumulators, and hooks left from a shut-down Horovod must not fire.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    x = torch.randn(args.batch_size, args.width)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
    )
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            hvd.allreduce(torch.zeros(1), name="sync.before")
            start = time.perf_counter()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    seconds = time.perf_counter() - start
    seconds = hvd.allreduce(torch.tensor(seconds), op=hvd.Max, name="sync.after").item()
    row = {
        "fusion_threshold": DEFAULT_FUSION_BYTES if fusion is None else fusion,
        "cycle_time_ms": cycle,
        "ms_per_step": 1e3 * seconds / args.steps,
        "steps": args.steps,
        "gradient_tensors": 2 * args.layers,
        "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "world_size": hvd.size(),
        "timeline": timeline,
        "responses_per_step": None,
        "rank": hvd.rank(),
    }
    del opt, model  # before shutdown: no gradient hook may outlive this initialisation
    hvd.shutdown()
    return row


def _count_responses(row: dict, steps: int, warmup: int) -> dict:
    """Fill ``responses_per_step`` from the setting's timeline (rank 0 writes it)."""
    from ddtk.frameworks.horovod_timeline import fused_groups, load_timeline

    if row.get("timeline") and Path(row["timeline"]).exists() and steps:
        groups = [g for g in fused_groups(load_timeline(row["timeline"])) if not g.is_sync]
        row["responses_per_step"] = len(groups) / (steps + warmup)
        row["max_tensors_per_response"] = max((len(g.tensors) for g in groups), default=0)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    """Sweep every (fusion, cycle) setting in this horovodrun job; rank 0 prints and writes rows."""
    import horovod.torch as hvd
    import torch

    args = _parse(argv)
    torch.set_num_threads(1)  # two ranks on two cores: more threads only fight each other
    cycles = [float(c) for c in args.cycle.split(",")]
    rows = []
    for k, cycle in enumerate(cycles):
        rows.append(_measure(hvd, args, args.fusion, cycle, args.trace if k == 0 else None))
    rank = rows[-1].pop("rank") if rows else 0
    for r in rows:
        r.pop("rank", None)
    if rank == 0:
        rows = [_count_responses(r, args.steps, args.warmup) for r in rows]
        for r in rows:
            print(json.dumps({k: v for k, v in r.items() if k != "timeline"}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


def run_sweep(
    cycles: list[float] = (5.0, 1.0, 0.1),  # type: ignore[assignment]
    fusions: list[int | None] = (None, 0),  # type: ignore[assignment]
    steps: int = 30,
    np: int = 2,
    trace_dir: str | os.PathLike | None = None,
    timeout: float = 120.0,
    echo: bool = True,
    **flags: object,
) -> list[dict]:
    """Run the jobs of :func:`job_plan` under ``horovodrun``; return rank 0's rows, one per setting.

    ``trace_dir`` keeps each job's timeline (``timeline_f<fusion>.json``, first
    setting of the job); ``flags`` become options (``layers=8`` -> ``--layers 8``).
    """
    from ddtk.frameworks.launchers import horovodrun_command, run_command

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hvd-knobs-") as folder:
        traces = Path(trace_dir or folder)  # without trace_dir, only long enough to count responses
        traces.mkdir(parents=True, exist_ok=True)
        for fusion, job_cycles in job_plan(list(fusions), list(cycles)):
            tag = "default" if fusion is None else str(fusion)
            out = Path(folder) / f"knobs_f{tag}.json"
            script = [
                "-m", "ddtk.frameworks.horovod_knobs",
                "--cycle", ",".join(f"{float(c):g}" for c in job_cycles),
                "--steps", str(steps),
                "--json", str(out),
                "--trace", str(traces / f"timeline_f{tag}.json"),  # not --timeline: horovodrun takes it
            ]  # fmt: skip
            if fusion is not None:
                script += ["--fusion", str(int(fusion))]
            for key, value in flags.items():
                script += [f"--{key.replace('_', '-')}", str(value)]
            run_command(horovodrun_command(np, script), timeout=timeout, echo=echo)
            rows += json.loads(out.read_text())
    if trace_dir is None:
        for r in rows:
            r["timeline"] = None  # it was in the folder just removed
    return rows


if __name__ == "__main__":
    main()
