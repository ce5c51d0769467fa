"""A data-parallel training job with bottlenecks you can plant, for profiling to find.

Every knob of :class:`JobConfig` is one classic way to make distributed training slow,
and each has a known answer, which is what the profiler's tests, ``ddtk profile``,
lecture 07 and lab 04 need:

==================  ========================================  ==============================
knob                what it plants                            what the fix is
==================  ========================================  ==============================
``data_ms``         input work per batch (decode, augment)    ``num_workers`` / prefetch
``bucket_cap_mb``   tiny DDP buckets: many small all-reduces  the default 25 MB
``micro_batches``   accumulation, ``no_sync=False``: an       ``no_sync()`` on all but the
                    all-reduce on every micro-batch           last micro-batch
``precision``       float32 matrix multiplies                 ``bf16`` autocast (pays from
                                                              micro-batches of about 64 up)
``straggler_ms``    one rank computes that much longer        replace or rebalance the node
``hidden/layers``   a big model, small batch: large           larger batch, compression
                    all-reduces dominate                      (``comm_hook``)
==================  ========================================  ==============================

:func:`run_job` runs it on ``world_size`` ranks of :func:`ddtk.launch` (PyTorch DDP over
gloo, or NCCL on GPUs), profiles a window of steps into ``trace_dir`` with
:class:`~ddtk.profiling.collect.StepProfiler`, then times further steps without the
profiler, so throughput is never measured under the profiler's own overhead.
"""

from __future__ import annotations

import dataclasses
import itertools
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "JOBS",
    "JobConfig",
    "JobResult",
    "job_config",
    "ray_train_loop",
    "run_job",
    "torchrun_rank",
    "train_rank",
    "under_torchrun",
]

PRECISIONS = ("fp32", "bf16")
COMM_HOOKS = (None, "fp16", "bf16", "powersgd")


@dataclass(frozen=True)
class JobConfig:
    """One configuration of the example job; every field has a safe, fast default."""

    batch_size: int = 64
    features: int = 256
    hidden: int = 512
    layers: int = 4
    classes: int = 10
    data_ms: float = 0.0
    num_workers: int = 0
    prefetch_factor: int = 2
    bucket_cap_mb: float = 25.0
    micro_batches: int = 1
    no_sync: bool = True
    precision: str = "fp32"
    straggler_rank: int | None = None
    straggler_ms: float = 0.0
    comm_hook: str | None = None
    record_shapes: bool = True
    profile_steps: int = 4
    timed_steps: int = 6
    seed: int = 0
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("batch_size", "features", "hidden", "layers", "classes", "micro_batches",
                     "profile_steps", "prefetch_factor"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"JobConfig.{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.timed_steps, int) or self.timed_steps < 0:
            raise ValueError(
                f"JobConfig.timed_steps must be an integer >= 0, got {self.timed_steps!r}"
            )
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(
                f"JobConfig.num_workers must be an integer >= 0, got {self.num_workers!r}"
            )
        for name in ("data_ms", "straggler_ms", "bucket_cap_mb"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"JobConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"JobConfig.bucket_cap_mb must be > 0, got {self.bucket_cap_mb!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"JobConfig.precision must be one of {PRECISIONS}, got {self.precision!r}"
            )
        if self.comm_hook not in COMM_HOOKS:
            raise ValueError(
                f"JobConfig.comm_hook must be one of {COMM_HOOKS}, got {self.comm_hook!r}"
            )
        if self.batch_size % self.micro_batches:
            raise ValueError(
                f"JobConfig.batch_size ({self.batch_size}) must split evenly into "
                f"{self.micro_batches} micro-batches"
            )

    def replace(self, **changes: Any) -> JobConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


JOBS: dict[str, JobConfig] = {
    "baseline": JobConfig(description="a healthy job: compute-bound, one all-reduce bucket"),
    "input-bound": JobConfig(data_ms=80.0, description="80 ms of input work per batch in the training process"),
    "straggler": JobConfig(straggler_rank=-1, straggler_ms=40.0,
                           description="the last rank computes 40 ms longer every step"),
    "comm-bound": JobConfig(batch_size=8, hidden=1536, layers=4, bucket_cap_mb=100.0,
                            description="a 7.5-million-parameter model on 8 samples: one 30 MB all-reduce dominates"),
    "tiny-buckets": JobConfig(bucket_cap_mb=0.05, layers=8,
                              description="50 KB DDP buckets: many small all-reduces per step"),
    "sync-every-microbatch": JobConfig(micro_batches=4, no_sync=False,
                                       description="4 accumulation micro-batches, each all-reduced"),
    "slow": JobConfig(batch_size=256, data_ms=100.0, bucket_cap_mb=0.05, micro_batches=4,
                      no_sync=False, straggler_rank=-1, straggler_ms=160.0, layers=4,
                      description="every planted problem at once, float32 included (lab 04's starting point)"),
}  # fmt: skip


def job_config(name: str) -> JobConfig:
    """The named preset of :data:`JOBS`; the error lists the names."""
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}; choose from {', '.join(JOBS)}")
    return JOBS[name]


@dataclass
class JobResult:
    """What one run measured: throughput over the unprofiled steps, and per-rank facts."""

    config: JobConfig
    world_size: int
    samples_per_s: float
    step_ms: float
    profiled_step_ms: float
    peak_rss_mib: list[float]
    losses: list[float]
    trace_dir: Path | None
    params: int = 0
    buckets: int = 0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["trace_dir"] = str(self.trace_dir) if self.trace_dir else None
        return d


def _busy_wait(ms: float, x: Any) -> None:
    """Real compute for ``ms`` milliseconds (a slower node), not a sleep.

    In products of ``features x features`` matrices (about a millisecond each on a CPU
    core), so a profiled window records a few hundred operators for the extra work
    rather than tens of thousands of tiny ones, and its trace stays small.
    """
    from torch.profiler import record_function

    with record_function("straggler:extra_compute"):
        end = time.perf_counter() + ms / 1e3
        a = (x.T @ x).tanh()
        while time.perf_counter() < end:
            a = (a @ a).tanh()


class _Collate:
    """Stack a batch after ``ms`` of input work (a sleep stands in for decode and augment)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples: list) -> Any:
        import torch

        if self.ms:
            time.sleep(self.ms / 1e3)
        xs, ys = zip(*samples)
        return torch.stack(xs), torch.stack(ys)


def _loader(cfg: JobConfig, rank: int, world: int, steps: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    n = steps * cfg.batch_size
    x = torch.randn(n, cfg.features, generator=g)
    y = torch.randint(0, cfg.classes, (n,), generator=g)
    data = list(zip(x, y))
    extra = (
        {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": True}
        if cfg.num_workers
        else {}
    )
    return torch.utils.data.DataLoader(
        data, batch_size=cfg.batch_size, collate_fn=_Collate(cfg.data_ms),
        num_workers=cfg.num_workers, **extra,
    )  # fmt: skip


def _model(cfg: JobConfig, device: Any) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(cfg.seed)
    layers: list[nn.Module] = [nn.Linear(cfg.features, cfg.hidden), nn.ReLU()]
    for _ in range(cfg.layers - 1):
        layers += [nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU()]
    layers.append(nn.Linear(cfg.hidden, cfg.classes))
    return nn.Sequential(*layers).to(device)


def _register_hook(ddp: Any, name: str | None) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                            start_powerSGD_iter=2, min_compression_rate=2)  # fmt: skip
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def _exporter(rank: int, world: int, metrics_dir: str | None, tensorboard_dir: str | None,
              metrics_port: int | None) -> Any:  # fmt: skip
    """The rank's Prometheus exporter, or None (export off).

    On ``127.0.0.1``: at port ``metrics_port + rank`` if given (a Prometheus configured with
    those targets beforehand), else a free one; registered for ``file_sd`` in ``metrics_dir``
    if given. Without either, as the environment asks (``DDTK_METRICS_PORT``,
    ``DDTK_METRICS_DIR``: :meth:`~ddtk.monitoring.TrainingMetrics.from_env`).
    """
    from ddtk.monitoring.exporter import TrainingMetrics

    if metrics_dir is not None or metrics_port is not None:
        port = 0 if metrics_port is None else metrics_port + rank
        return TrainingMetrics(rank, world, port=port, targets_dir=metrics_dir, tensorboard_dir=tensorboard_dir)
    return TrainingMetrics.from_env(rank, world)


def train_rank(
    ctx: Any,
    cfg: JobConfig,
    trace_dir: str | None,
    metrics_dir: str | None = None,
    tensorboard_dir: str | None = None,
    metrics_port: int | None = None,
) -> dict:
    """One rank of the job; returns its measurements.

    ``ctx`` is the :class:`ddtk.DistributedContext` of :func:`run_job`, or None where
    something else initialised ``torch.distributed`` (torchrun, Ray Train's
    ``TorchTrainer``: see :func:`ray_train_loop`). With ``metrics_dir`` or ``metrics_port``
    (or the variables of :meth:`ddtk.monitoring.TrainingMetrics.from_env`) the rank exports
    its step time, samples, loss and, once the profiled window is written, its step shares
    to Prometheus (the analysis of its trace is not counted in the next step's time).
    """
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddtk.profiling.collect import StepProfiler

    rank, world = (ctx.rank, ctx.world_size) if ctx else (dist.get_rank(), dist.get_world_size())
    straggler = None if cfg.straggler_rank is None else cfg.straggler_rank % world
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    model = DDP(_model(cfg, device), bucket_cap_mb=cfg.bucket_cap_mb)
    _register_hook(model, cfg.comm_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    prof = StepProfiler(trace_dir or ".", wait=1, warmup=1, active=cfg.profile_steps,
                        record_shapes=cfg.record_shapes, enabled=trace_dir is not None)  # fmt: skip
    steps = prof.steps_needed + cfg.timed_steps
    amp = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if cfg.precision == "bf16"
        else contextlib.nullcontext()
    )
    loss_value, t_start, marks = 0.0, None, [time.perf_counter()]
    metrics = _exporter(rank, world, metrics_dir, tensorboard_dir, metrics_port)
    shared, step_began = False, marks[0]
    with prof, metrics if metrics is not None else contextlib.nullcontext():
        for step, (x, y) in enumerate(_loader(cfg, rank, world, steps)):
            if step == prof.steps_needed:
                dist.barrier()
                t_start = step_began = time.perf_counter()  # the profiler's stall is no step
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            for i, (xm, ym) in enumerate(
                zip(x.chunk(cfg.micro_batches), y.chunk(cfg.micro_batches))
            ):
                last = i == cfg.micro_batches - 1
                sync = contextlib.nullcontext() if last or not cfg.no_sync else model.no_sync()
                with sync:
                    with amp:
                        loss = torch.nn.functional.cross_entropy(model(xm), ym) / cfg.micro_batches
                    if rank == straggler and cfg.straggler_ms:
                        _busy_wait(cfg.straggler_ms / cfg.micro_batches, xm)
                    loss.backward()
                loss_value += float(loss.detach()) if step == steps - 1 else 0.0
            opt.step()
            prof.step()
            marks.append(time.perf_counter())
            if metrics is not None:
                metrics.step(marks[-1] - step_began, x.shape[0], float(loss.detach()) * cfg.micro_batches)
                step_began = marks[-1]
                if prof.written and not shared:  # the profiled window just closed
                    shared = bool(metrics.shares_from_trace(prof.written[-1]))
                    step_began = time.perf_counter()  # the analysis is not a training step
    dist.barrier()
    elapsed = time.perf_counter() - t_start if t_start is not None else 0.0
    window = slice(prof.wait + prof.warmup, prof.steps_needed)
    # DDP's own record of the buckets it rebuilt after step 1. Private, with no public twin
    # (a comm hook would add itself to the trace): tests/test_ddp_private_apis.py pins its keys.
    logged = model._get_ddp_logging_data()
    sizes = str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or "")
    profiled = [b - a for a, b in itertools.pairwise(marks)][window]
    return {
        "rank": rank, "world_size": world, "elapsed": elapsed, "loss": loss_value,
        "params": sum(p.numel() for p in model.parameters()),
        "buckets": len([b for b in sizes.split(",") if b.strip()]),
        "profiled_step_s": sorted(profiled)[len(profiled) // 2],
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }  # fmt: skip


def ray_train_loop(config: dict) -> None:
    """The job as a Ray Train V2 worker function: ``TorchTrainer(ray_train_loop, train_loop_config=
    {"job": name or JobConfig, "trace_dir": shared folder})``. Each worker writes ``rank<r>.json``
    with its world rank and reports its measurements."""
    import ray.train
    import torch

    torch.set_num_threads(1)
    job = config.get("job", "baseline")
    cfg = job_config(job) if isinstance(job, str) else job
    ray.train.report(train_rank(None, cfg, config.get("trace_dir"), config.get("metrics_dir")))


def run_job(
    config: JobConfig | str = "baseline",
    world_size: int = 2,
    trace_dir: str | Path | None = None,
    backend: str = "auto",
    timeout: float = 300.0,
    echo: bool = False,
    metrics_dir: str | Path | None = None,
    tensorboard_dir: str | Path | None = None,
    metrics_port: int | None = None,
) -> JobResult:
    """Run the job on ``world_size`` local ranks; profile into ``trace_dir`` if given.

    Every rank serves Prometheus metrics (:class:`ddtk.monitoring.TrainingMetrics`) on
    ``127.0.0.1`` when asked: with ``metrics_port``, rank ``r`` on port ``metrics_port + r``
    (for a Prometheus given those targets); with ``metrics_dir``, on a free port that it
    writes into ``metrics_dir/rank<r>.json`` for Prometheus's ``file_sd``. With
    ``tensorboard_dir`` too, each rank writes TensorBoard scalars under ``rank<r>``.

    Throughput is measured over ``config.timed_steps`` steps that run after the profiled
    window, with the profiler already stopped. ``profiled_step_ms`` is the median step
    inside the window (the slowest rank's), so the two give the profiler's overhead.
    """
    import ddtk
    from ddtk.comm.context import resolve_backend

    cfg = job_config(config) if isinstance(config, str) else config
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if cfg.comm_hook == "bf16" and resolve_backend(backend, world_size) != "nccl":
        raise ValueError(
            "comm_hook='bf16' needs the NCCL backend (PyTorch's bf16 hook is CUDA-only); "
            "on gloo use comm_hook='fp16' or 'powersgd'"
        )
    if metrics_port is not None and (
        isinstance(metrics_port, bool) or not isinstance(metrics_port, int)
        or not 0 < metrics_port <= 65536 - world_size
    ):  # fmt: skip
        raise ValueError(f"metrics_port must be a port from 1 to {65536 - world_size} "
                         f"(rank r listens on metrics_port + r), got {metrics_port!r}")  # fmt: skip
    if tensorboard_dir is not None and metrics_dir is None and metrics_port is None:
        raise ValueError("tensorboard_dir is written by each rank's exporter: give metrics_dir or metrics_port too")
    if trace_dir is not None:
        trace_dir = Path(trace_dir)
        trace_dir.mkdir(parents=True, exist_ok=True)
        for old in trace_dir.glob("rank*.json"):
            old.unlink()  # a trace from an earlier, larger run would be mixed in
    results = ddtk.launch(
        train_rank, world_size=world_size,
        args=(cfg, *(str(d) if d else None for d in (trace_dir, metrics_dir, tensorboard_dir)), metrics_port),
        backend=backend, timeout=timeout, echo=echo, validate=False,
    )  # fmt: skip
    elapsed = max(r["elapsed"] for r in results)
    samples = cfg.timed_steps * cfg.batch_size * world_size
    return JobResult(
        config=cfg, world_size=world_size,
        samples_per_s=samples / elapsed if elapsed > 0 else float("nan"),
        step_ms=1e3 * elapsed / cfg.timed_steps if cfg.timed_steps else float("nan"),
        profiled_step_ms=1e3 * max(r["profiled_step_s"] for r in results),
        peak_rss_mib=[r["rss_mib"] for r in results], losses=[r["loss"] for r in results],
        trace_dir=trace_dir, params=results[0]["params"], buckets=results[0]["buckets"],
    )  # fmt: skip


_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True in a process that ``torchrun`` (or another launcher with its variables) started."""
    import os

    return all(v in os.environ for v in _TORCHRUN_VARS)


def torchrun_rank(job: str | JobConfig, trace_dir: str | None) -> dict:
    """Be one rank of the job in a process ``torchrun`` started: join its process group,
    train (profiled into ``trace_dir`` if given), leave the group; returns the rank's measurements."""
    import os

    import torch
    import torch.distributed as dist

    cfg = job_config(job) if isinstance(job, str) else job
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        return train_rank(None, cfg, trace_dir)
    finally:
        dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> Any:
    """The command line of :func:`main` (``tests/test_manifests.py`` checks the manifests' against it)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m ddtk.profiling.jobs", description=main.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("job", choices=list(JOBS))
    p.add_argument("-n", "--world-size", type=int, default=2)
    p.add_argument(
        "--trace-dir", default=None, help="profile a window of steps into DIR/rank<r>.json"
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps (default: the preset's)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on PORT + LOCAL_RANK (0: a free port)")  # fmt: skip
    p.add_argument("--metrics-dir", default=None, help="register each rank for Prometheus's file_sd in DIR")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m ddtk.profiling.jobs JOB [-n N] [--trace-dir DIR] [--steps N] [--metrics-port P]``: run a job.

    Started plainly it launches its own ``N`` ranks (``ddtk.launch``), for py-spy to
    sample. Started by ``torchrun`` it is one rank of a job that ``torchrun`` spreads
    over its processes and nodes (``-n`` is then ignored): ``torchrun --nproc-per-node 8
    -m ddtk.profiling.jobs slow --trace-dir /shared/traces``. ``--metrics-port``
    and ``--metrics-dir`` export each rank's metrics to Prometheus (see
    :meth:`ddtk.monitoring.TrainingMetrics.from_env`); ``--steps`` sets the timed steps.
    """
    import os

    args = parse_args(argv)
    cfg = job_config(args.job)
    cfg = cfg if args.steps is None else cfg.replace(timed_steps=args.steps)
    for var, value in (("DDTK_METRICS_PORT", args.metrics_port), ("DDTK_METRICS_DIR", args.metrics_dir)):
        if value is not None:
            os.environ[var] = str(value)  # read in each rank (ddtk.launch copies the environment)
    if under_torchrun():
        out = torchrun_rank(cfg, args.trace_dir)
        step_ms = 1e3 * out["elapsed"] / max(cfg.timed_steps, 1)
        print(
            f"{args.job}: rank {out['rank']} of {out['world_size']}: {step_ms:.1f} ms per step",
            flush=True,
        )
        return 0
    r = run_job(cfg, args.world_size, args.trace_dir)
    print(f"{args.job}: {r.samples_per_s:.0f} samples/s, {r.step_ms:.1f} ms per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
