"""Lab 02 (multi-node training with Horovod): the judged exercises 1 to 8.

Each check computes what a correct answer produces with its own trusted code (Horovod's
own slot assignment, the lab's definitions written out here) and compares it with what
the learner's code produced in a worker (see :mod:`ddtk.course.judging`). Inputs are
seeded with the judge's secret, so none of them is one the notebook used, and the
Horovod exercises run the learner's functions on **two real Horovod ranks** (Gloo,
``horovod.run`` over the two host names ``localhost`` and ``127.0.0.1``, inside the
worker's confinement) where what a single process cannot show is at stake:

1. **where ranks land**: seeded host lists of uneven sizes, ``np`` below the slot count
   and above it (``ValueError``); the judge asks Horovod's own
   ``get_host_assignments`` for the truth.
2. **join the job, pin the device, share the cores**: in the worker (a job of one),
   Horovod must be initialised by the answer and torch's threads set to the seeded
   (odd) core count; then on two ranks laid out as two hosts of one machine (rank 1 is
   ``local_rank`` 0 on the second host) each rank must join a job of size 2 and take
   half the cores, rounded down (``local_size()`` says 1 there); told through the
   machine-name calls (``socket.gethostname``, ``platform.node``, ``os.uname``) that
   they are on machines of their own, every core (``size()`` says 2); and on the GPU
   path (``torch.cuda.set_device`` replaced by a recorder) pin and return GPU
   ``local_rank``, which only an answer using ``local_rank`` (not ``rank``) does.
3. **scaled learning rate**: seeded base rates, world sizes, fractional warm-up lengths
   and steps on both sides of the warm-up's end.
4. **broadcast and DistributedOptimizer**: two ranks build a small model (with batch
   norm) from different seeds, batch-norm statistics from their own data, and an
   optimizer with their own learning rate and momentum; after the answer's
   ``distribute`` the judge compares every rank's full state and optimizer settings
   with rank 0's, which it computes itself, and after two steps on each rank's own
   seeded data the parameters with its own run of rank 0's start on the ranks'
   averaged gradients. The same again with ``hvd.Compression.fp16`` must come out
   close to that and not bit for bit the uncompressed result: the compression
   argument is used.
5. **average the metrics, rank 0 saves**: seeded metrics per rank, inserted in a
   different order on each rank, must come back as their float64 mean on every rank;
   each rank gets its own checkpoint path, so the judge sees on disk which ranks wrote:
   only rank 0's may exist, holding rank 0's (seeded) weights and the epoch.
6. **read a timeline**: seeded synthetic Horovod timelines (interleaved tensors, spans
   nested two deep, an instant event before the first span, spans still open at the
   end, an unterminated file read with the lab's ``load_trace``); the judge parses them
   itself.
7. **diagnose the all-reduce**: seeded span tables, one per verdict (rank skew, latency,
   bandwidth, copy) in shuffled rows, each with a trap: a metric all-reduce that would
   win if counted, tensors whose overlapping negotiations would win if summed, calls
   whose bytes per tensor sit below the threshold and bytes per call above it, a
   broadcast row with more bytes than any call; the threshold is seeded, and where
   bandwidth is the answer a call stays under the default 256 KiB.
8. **what limits scaling**: seeded throughput drawn from a known serial fraction s and
   overhead growth g (X(n) = X(1) n / (1 + s (n - 1) + g (n - 1)^2), so e(n) = s + g (n - 1)
   exactly), inserted in any order: a constant e, a growing one, a host with fewer cores
   than the processes measured, one process count above 1, and the inputs that must
   raise. The judge applies the exercise's rules itself and compares e(n), the trend,
   the limit and the predictions.

Exercise 9 (the interpretation) is free text about the learner's own measurements:
no check can judge it, so it stays in the kernel's check (no blank left) and in the
hand-in report, which the instructor reads.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ddtk.course.checks import CheckFailed, expect
from ddtk.course.judging import Context, Exercise, LabJudge, check_here

_P = __name__
TWO_HOSTS = "localhost:1,127.0.0.1:1"  # two "nodes" of one slot each: rank 1 is local_rank 0
# A rank that never submits a collective the other waits in fails the job in seconds,
# not at the worker's timeout.
_STALL = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"}
_HOROVOD_RECIPES = ("ddtk.examples", "ddtk.frameworks", "ddtk.recovery", "horovod.runner")
_TIMELINE_READERS = ("ddtk.frameworks", "ddtk.profiling", "ddtk.examples")
_SCALING = ("ddtk.profiling", "ddtk.project", "ddtk.frameworks", "ddtk.bench", "ddtk.viz")
# What the lab's set-up cell hands out from the modules above.
_GIVEN = tuple(
    f"ddtk.frameworks.launchers.{n}"
    for n in ("LauncherError", "free_port", "horovodrun_command", "run_command", "torchrun_command")
)


# ------------------------------------------------------------------ Horovod ranks


def close_leaked_rendezvous() -> None:
    """Stop the rendezvous HTTP servers ``horovod.run`` (0.28.1) leaves in this process."""
    import gc
    import warnings

    from horovod.runner.http.http_server import RendezvousHTTPServer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        leaked = [o for o in gc.get_objects() if isinstance(o, RendezvousHTTPServer)]
    for server in leaked:
        if server.socket.fileno() != -1:
            server.shutdown()
            server.server_close()


def run_ranks(fn: Callable[..., Any], *args: Any, hosts: str = TWO_HOSTS) -> list[Any]:
    """``fn(*args)`` on one Horovod rank per slot of ``hosts`` (Gloo); results in rank order."""
    import horovod

    saved = {k: os.environ.get(k) for k in _STALL}
    os.environ.update(_STALL)
    try:
        slots = sum(int(h.rsplit(":", 1)[1]) for h in hosts.split(","))
        return horovod.run(fn, args=args, num_proc=slots, hosts=hosts, use_gloo=True)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        close_leaked_rendezvous()


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


def _rank_failure(results: list[Any], what: str) -> None:
    """Raise CheckFailed naming the first rank whose part of the probe raised."""
    failed = [r for r in results if isinstance(r, Mapping) and "error" in r]
    if failed:
        # a rank that raised first makes the other's collective fail: show the cause
        first = next((r for r in failed if "Horovod" not in r["error"]), failed[0])
        raise CheckFailed(f"{what} raised on rank {first['rank']}: {first['error']}")


class _Recorder:
    """Stands in for ``torch.cuda.set_device`` on a machine without GPUs: records the index."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, device: Any) -> None:
        import torch

        self.calls.append(device if isinstance(device, int) else torch.device(device).index)


def _gpu_setup(horovod_setup: Callable[..., Any]) -> dict[str, Any]:
    """``horovod_setup(True, 1)`` with ``set_device`` recorded: what was pinned and returned,
    or what it raised."""
    import torch

    recorder, real = _Recorder(), torch.cuda.set_device
    torch.cuda.set_device = recorder
    try:
        device = horovod_setup(True, 1)
    except Exception as exc:  # the check says so, after what the CPU path showed
        return {"error": _error_text(exc)}
    finally:
        torch.cuda.set_device = real
    return {"pinned": recorder.calls, "device": str(device)}


# ------------------------------------------------------------------ exercise 1


def probe_placement(ns: dict[str, Any], cases: list[tuple[int, str]]) -> list[Any]:
    """``placement(np, hosts)`` for each case: the list of dicts, or ``"ValueError"``."""
    out: list[Any] = []
    for n, hosts in cases:
        try:
            got = ns["placement"](n, hosts)
        except ValueError:
            out.append("ValueError")
            continue
        out.append([{str(k): v for k, v in dict(d).items()} for d in got])
    return out


def expected_placement(n: int, hosts: str) -> list[dict] | str:
    """What horovodrun assigns, by Horovod's own function."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    try:
        slots = get_host_assignments(parse_hosts(hosts), n, n)
    except ValueError:
        return "ValueError"
    return [{"rank": s.rank, "host": s.hostname, "local_rank": s.local_rank,
             "cross_rank": s.cross_rank} for s in slots]  # fmt: skip


def placement_cases(rng: random.Random) -> list[tuple[int, str]]:
    """Seeded host lists of uneven sizes (the first has a small host before a bigger one);
    np at, below and above the slot count."""
    cases = []
    for i in range(6):
        names = rng.sample([f"node{k:02d}" for k in range(1, 40)], rng.randint(2, 5))
        names = [f"10.0.{rng.randint(0, 9)}.{rng.randint(2, 250)}" if rng.random() < 0.3 else n
                 for n in names]  # fmt: skip
        slots = {h: rng.randint(1, 4) for h in names}  # a name drawn twice counts once
        if i == 0:
            slots[names[0]], slots[names[1]] = 1, rng.randint(2, 4)
        hosts = ",".join(f"{h}:{n}" for h, n in slots.items())
        total = sum(slots.values())
        cases.append((total, hosts))
        cases.append((rng.randint(1, max(1, total - 1)), hosts))
    cases.append((cases[-2][0] + rng.randint(1, 3), cases[-2][1]))  # more ranks than slots
    return cases


def check_placement(ctx: Context) -> None:
    cases = placement_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_placement", cases=cases)
    for (n, hosts), value in zip(cases, got):
        want = expected_placement(n, hosts)
        if value == want:
            continue
        if want == "ValueError" or value == "ValueError":
            expect(False, f"placement({n}, {hosts!r})", expected=want, got=value)
        wrong = next(
            (i for i, (a, b) in enumerate(zip(value, want)) if a != b), min(len(value), len(want))
        )
        expect(
            False,
            f"placement({n}, {hosts!r}), Horovod's own assignment, first wrong at rank {wrong}",
            expected=want[wrong] if wrong < len(want) else f"{len(want)} ranks",
            got=value[wrong] if wrong < len(value) else f"{len(value)} ranks",
        )


# ------------------------------------------------------------------ exercise 2


@contextlib.contextmanager
def _machine_named(name: str) -> Iterator[None]:
    """This process reports ``name`` as its machine's name to every call that asks for it."""
    import platform
    import socket

    saved = socket.gethostname, platform.node, os.uname
    real = os.uname()
    socket.gethostname = lambda: name
    platform.node = lambda: name
    os.uname = lambda: os.uname_result(
        (real.sysname, name, real.release, real.version, real.machine)
    )
    try:
        yield
    finally:
        socket.gethostname, platform.node, os.uname = saved


def _rank_setup(horovod_setup: Callable[..., Any], cores: int) -> dict[str, Any]:
    """On each rank: the CPU path on the real machine, again on a machine of its own (its
    name changed), then the GPU path."""
    import horovod.torch as hvd
    import torch

    rank = int(os.environ.get("HOROVOD_RANK", "-1"))
    try:
        torch.set_num_threads(1)  # not the count asked for: the answer must set it
        device = horovod_setup(False, cores)
        cpu = {"size": hvd.size(), "rank": hvd.rank(), "local_rank": hvd.local_rank(),
               "threads": torch.get_num_threads(), "device": str(device)}  # fmt: skip
        torch.set_num_threads(1)
        with _machine_named(f"ddtk-judge-node-{rank}"):
            horovod_setup(False, cores)
        apart = torch.get_num_threads()
        return {"rank": rank, "cpu": cpu, "apart": apart, "gpu": _gpu_setup(horovod_setup)}
    except Exception as exc:
        return {"rank": rank, "error": _error_text(exc)}


def probe_setup_here(ns: dict[str, Any], cores: int) -> dict[str, Any]:
    """``horovod_setup`` in this process, starting from a Horovod that is not initialised."""
    hvd, torch = ns["hvd"], ns["torch"]
    before = torch.get_num_threads()
    if hvd.is_initialized():
        hvd.shutdown()
    torch.set_num_threads(1)  # not the count asked for: the answer must set it
    try:
        device = ns["horovod_setup"](False, cores)
        out = {"initialised": hvd.is_initialized(), "threads": torch.get_num_threads(),
               "device": str(device)}  # fmt: skip
        out["gpu"] = _gpu_setup(ns["horovod_setup"])
    finally:
        torch.set_num_threads(before)
    return out


def probe_setup_ranks(ns: dict[str, Any], cores: int) -> list[Any]:
    """``horovod_setup`` on two ranks laid out as two hosts of one slot each."""
    return run_ranks(_rank_setup, ns["horovod_setup"], cores)


def check_setup(ctx: Context) -> None:
    cores = random.Random(ctx.seed).choice([5, 7, 9, 11])  # odd: half of it is rounded down
    local_rank = {p["rank"]: p["local_rank"] for p in expected_placement(2, TWO_HOSTS)}
    worker = ctx.worker()
    here = worker.probe(f"{_P}:probe_setup_here", cores=cores)
    expect(here["initialised"], "Horovod initialised after horovod_setup(False, ...), in a "
           "process where it was not", expected=True, got=here["initialised"])  # fmt: skip
    expect(here["threads"] == cores, f"torch's threads after horovod_setup(False, cores={cores}) "
           "in a job of one rank", expected=cores, got=here["threads"])  # fmt: skip
    expect(here["device"] == "cpu", "the device returned without a GPU", expected="cpu",
           got=here["device"])  # fmt: skip
    _check_gpu(here["gpu"], 0, "in one process")
    ranks = worker.probe(f"{_P}:probe_setup_ranks", cores=cores)
    _rank_failure(ranks, "horovod_setup")
    for r in ranks:
        cpu = r["cpu"]
        expect(cpu["size"] == 2, f"hvd.size() on rank {r['rank']} of a job of two ranks",
               expected=2, got=cpu["size"])  # fmt: skip
        expect(cpu["threads"] == cores // 2 and cpu["device"] == "cpu",
               f"threads and device on rank {r['rank']} after horovod_setup(False, {cores}), "
               f"two ranks on one machine under two host names ({TWO_HOSTS}: local_size() is 1)",
               expected=(cores // 2, "cpu"), got=(cpu["threads"], cpu["device"]))  # fmt: skip
        expect(r["apart"] == cores, f"threads on rank {r['rank']} after horovod_setup(False, "
               f"{cores}) when socket.gethostname() says each rank is on a machine of its own "
               "(size() is still 2)", expected=cores, got=r["apart"])  # fmt: skip
        want = local_rank[r["rank"]]
        _check_gpu(r["gpu"], want, f"on rank {r['rank']} of {TWO_HOSTS} (local_rank {want}"
                   + (": the first slot of the second host)" if r["rank"] != want else ")"))  # fmt: skip


def _check_gpu(gpu: Mapping[str, Any], local_rank: int, where: str) -> None:
    want = f"cuda:{local_rank}"
    expect("error" not in gpu, f"horovod_setup(True, 1) {where}", expected=f"GPU {local_rank} "
           "pinned and returned (the judge has no GPU: it records torch.cuda.set_device, and "
           "the answer needs nothing else from CUDA)", got=f"it raised {gpu.get('error')}")  # fmt: skip
    expect(
        gpu["pinned"] == [local_rank],
        f"torch.cuda.set_device calls of horovod_setup(True, ...) {where}",
        expected=f"[{local_rank}] (one GPU per process, chosen by local_rank, not rank)",
        got=gpu["pinned"],
    )
    expect(gpu["device"] == want, f"the device horovod_setup(True, ...) returns {where}",
           expected=want, got=gpu["device"])  # fmt: skip


# ------------------------------------------------------------------ exercise 3


def probe_lr(ns: dict[str, Any], cases: list[tuple[int, int, float, int, float]]) -> list[float]:
    """``scaled_lr`` for each case."""
    return [float(ns["scaled_lr"](*case)) for case in cases]


def expected_lr(step: int, steps_per_epoch: int, base_lr: float, size: int, warmup: float) -> float:
    """Linear from ``base_lr`` at step 0 to ``base_lr * size`` at ``warmup`` epochs, then flat."""
    steps = warmup * steps_per_epoch
    progress = 1.0 if steps <= 0 else min(1.0, step / steps)
    return base_lr * (1.0 + (size - 1) * progress)


def lr_cases(rng: random.Random) -> list[tuple[int, int, float, int, float]]:
    """Seeded schedules: fractional warm-ups, steps on both sides of the end, no warm-up, size 1."""
    cases = []
    warmups = rng.sample([0.7, 1.3, 2.25, 3.6], 3)  # at least two end between two steps
    for size, warmup in ((rng.choice([2, 3, 6]), 0.0), (1, rng.choice([0.5, 2.0])),
                         *((rng.choice([2, 3, 5, 8, 12]), w) for w in warmups)):  # fmt: skip
        spe, base = rng.choice([3, 5, 7, 11]), round(rng.uniform(0.005, 0.2), 4)
        end = warmup * spe
        steps = {0, 1, int(end), int(end) + 1, math.ceil(end) + rng.randint(2, 9)}
        steps |= {rng.randrange(max(1, int(end) + 1)) for _ in range(3)}
        cases += [(s, spe, base, size, warmup) for s in sorted(steps)]
    return cases


def check_lr(ctx: Context) -> None:
    cases = lr_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_lr", cases=cases)
    for case, value in zip(cases, got):
        want = expected_lr(*case)
        step, spe, base, size, warmup = case
        expect(
            math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12),
            f"scaled_lr(step={step}, steps_per_epoch={spe}, base_lr={base}, size={size}, "
            f"warmup_epochs={warmup}) (warm-up ends at step {warmup * spe:g})",
            expected=round(want, 9),
            got=round(value, 9),
        )


# ------------------------------------------------------------------ exercise 4

BATCH, FEATURES, CLASSES = 8, 12, 4


def tiny_model(seed: int) -> Any:
    """A small model with batch norm (buffers a broadcast of parameters alone would miss)."""
    import torch
    from torch import nn

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(),
                             nn.Linear(16, CLASSES))  # fmt: skip


def batch(seed: int, rank: int, step: int) -> tuple[Any, Any]:
    """Rank ``rank``'s seeded data for ``step`` (-1: the forward pass before distribute)."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1000 + rank * 100 + step + 1)
    return torch.randn(BATCH, FEATURES, generator=gen), torch.randint(0, CLASSES, (BATCH,),
                                                                       generator=gen)  # fmt: skip


def rank_optimizer(model: Any, seed: int, rank: int) -> Any:
    """Each rank's own learning rate and momentum (only rank 0's may survive distribute)."""
    import torch

    lr = 0.01 + (seed % 97) / 1000
    return torch.optim.SGD(model.parameters(), lr=lr * (rank + 1), momentum=0.9 - 0.3 * rank)


def _loss(model: Any, data: tuple[Any, Any]) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(model(data[0]), data[1])


def start_state(seed: int, rank: int) -> tuple[Any, Any]:
    """Rank ``rank``'s model (its own seed, batch-norm statistics from its own data) and
    optimizer (its own learning rate and momentum). The optimizer has no state yet:
    ``hvd.DistributedOptimizer`` builds a new optimizer from the param groups, so state
    broadcast before wrapping would be dropped, and either order is a right answer."""
    import torch

    model = tiny_model(seed + rank)
    with torch.no_grad():
        model(batch(seed, rank, -1)[0])  # train mode: updates the running statistics
    return model, rank_optimizer(model, seed, rank)


def _rank_distribute(distribute: Callable[..., Any], seed: int, steps: int) -> dict[str, Any]:
    """On each rank: a different start, the answer's distribute(), ``steps`` steps on own data."""
    import horovod.torch as hvd
    import torch

    rank = int(os.environ.get("HOROVOD_RANK", "-1"))
    try:
        hvd.init()
        torch.set_num_threads(1)
        rank = hvd.rank()
        out: dict[str, Any] = {"rank": rank}
        for name in ("none", "fp16"):
            model, optimizer = start_state(seed, rank)
            wrapped = distribute(model, optimizer, getattr(hvd.Compression, name))
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            group = wrapped.param_groups[0]
            for step in range(steps):
                wrapped.zero_grad()
                _loss(model, batch(seed, rank, step)).backward()
                wrapped.step()
            out[name] = {"state": state, "lr": float(group["lr"]),
                         "momentum": float(group["momentum"]),
                         "params": {k: p.detach().clone() for k, p in model.named_parameters()}}  # fmt: skip
        return out
    except Exception as exc:
        return {"rank": rank, "error": _error_text(exc)}


def probe_distribute(ns: dict[str, Any], seed: int, steps: int) -> list[Any]:
    """The answer's ``distribute`` on two ranks (see :func:`_rank_distribute`)."""
    return run_ranks(_rank_distribute, ns["distribute"], seed, steps)


def reference_distributed(seed: int, steps: int) -> dict[str, Any]:
    """Rank 0's start, then ``steps`` steps with the ranks' gradients averaged."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run
    try:
        return _reference_distributed(seed, steps)
    finally:
        torch.set_num_threads(threads)


def _reference_distributed(seed: int, steps: int) -> dict[str, Any]:
    import torch

    model, optimizer = start_state(seed, 0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for step in range(steps):
        grads = []
        for rank in (0, 1):
            model.zero_grad()
            _loss(model, batch(seed, rank, step)).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for p, g0, g1 in zip(model.parameters(), *grads):
                p.grad = (g0 + g1) / 2
        optimizer.step()
    group = optimizer.param_groups[0]
    return {"state": state, "lr": group["lr"], "momentum": group["momentum"],
            "params": {k: p.detach().clone() for k, p in model.named_parameters()}}  # fmt: skip


# Between the judge's own computation and the ranks': the same numbers, maybe not the
# same bits (another machine's kernels, another summation order).
_ATOL = 1e-5


def _differs(want: Mapping[str, Any], got: Any, atol: float = 0.0) -> list[str]:
    """Names whose tensors differ (beyond ``atol``) or are missing."""
    import torch

    if not isinstance(got, Mapping):
        return ["(not a dict of tensors)"]
    bad = []
    for k, w in want.items():
        g = got.get(k)
        same = isinstance(g, torch.Tensor) and g.shape == w.shape and (
            torch.equal(g, w) if atol == 0 else torch.allclose(g.double(), w.double(), atol=atol, rtol=0)
        )  # fmt: skip
        if not same:
            bad.append(k)
    return bad


def check_distribute(ctx: Context) -> None:
    steps = 2
    ranks = ctx.worker().probe(f"{_P}:probe_distribute", seed=ctx.seed, steps=steps)
    _rank_failure(ranks, "distribute() or the two training steps after it")
    want = reference_distributed(ctx.seed, steps)
    for r in ranks:
        got = r["none"]
        diff = _differs(want["state"], got["state"], atol=_ATOL)
        expect(not diff, f"the model's state_dict on rank {r['rank']} right after distribute()",
               expected="rank 0's parameters and buffers (the ranks started from different seeds "
               "and batch-norm statistics)", got=f"different tensors {diff}")  # fmt: skip
        expect((got["lr"], got["momentum"]) == (want["lr"], want["momentum"]),
               f"learning rate and momentum on rank {r['rank']} after distribute()",
               expected=f"rank 0's {(want['lr'], want['momentum'])} (its optimizer state broadcast)",
               got=(got["lr"], got["momentum"]))  # fmt: skip
    finals = [r["none"]["params"] for r in ranks]
    apart = _differs(finals[0], finals[1])
    expect(not apart, f"parameters after {steps} steps on each rank's own data",
           expected="identical on both ranks (gradients averaged before every step)",
           got=f"tensors that differ between the ranks {apart}")  # fmt: skip
    off = _differs(want["params"], finals[0], atol=_ATOL)
    expect(not off, f"parameters after {steps} steps, identical on both ranks",
           expected="those of rank 0's start trained with the average of the two ranks' "
           "gradients", got=f"other values in {off} (summed instead of averaged, or from "
           "another rank's start?)")  # fmt: skip
    fp16 = [r["fp16"]["params"] for r in ranks]
    expect(not _differs(fp16[0], fp16[1]), "parameters with hvd.Compression.fp16",
           expected="identical on both ranks", got="different")  # fmt: skip
    exact = not _differs(finals[0], fp16[0])
    expect(not exact, "parameters trained with compression=hvd.Compression.fp16",
           expected="gradients sent as float16 (close to, not bit for bit, the uncompressed run)",
           got="bit for bit the uncompressed run: the compression argument is not used")  # fmt: skip
    far = _differs(want["params"], fp16[0], atol=1e-2)
    expect(not far, "parameters trained with compression=hvd.Compression.fp16",
           expected="within 1e-2 of the uncompressed result", got=f"far off in {far}")  # fmt: skip


# ------------------------------------------------------------------ exercise 5


def rank_metrics(seed: int, rank: int) -> dict[str, float]:
    """Seeded metrics for ``rank``, inserted in a rank-dependent order."""
    rng = random.Random(seed * 31 + rank)
    names = ["loss", "accuracy", "top3_accuracy", "calibration"]
    values = {n: random.Random(seed * 7 + i).random() + rng.random() for i, n in enumerate(names)}
    order = names if rank % 2 == 0 else names[::-1]
    return {n: values[n] for n in order}


def _rank_end_epoch(end_epoch: Callable[..., Any], seed: int, folder: str, epoch: int) -> dict:
    """On each rank: its own model and metrics; its own checkpoint path (the judge sees who wrote)."""
    import horovod.torch as hvd
    import torch

    rank = int(os.environ.get("HOROVOD_RANK", "-1"))
    try:
        hvd.init()
        torch.set_num_threads(1)
        rank = hvd.rank()
        model = tiny_model(seed + 10 + rank)
        path = str(Path(folder) / f"rank{rank}-model.pt")
        averaged = end_epoch(model, rank_metrics(seed, rank), epoch, path)
        return {"rank": rank, "averaged": {str(k): float(v) for k, v in dict(averaged).items()}}
    except Exception as exc:
        return {"rank": rank, "error": _error_text(exc)}


def probe_end_epoch_here(ns: dict[str, Any], seed: int, path: str, epoch: int) -> dict[str, float]:
    """``end_epoch`` in this process (Horovod of size 1)."""
    hvd = ns["hvd"]
    if not hvd.is_initialized():
        hvd.init()
    averaged = ns["end_epoch"](tiny_model(seed + 10), rank_metrics(seed, 0), epoch, path)
    return {str(k): float(v) for k, v in dict(averaged).items()}


def probe_end_epoch_ranks(ns: dict[str, Any], seed: int, folder: str, epoch: int) -> list[Any]:
    """``end_epoch`` on two ranks (see :func:`_rank_end_epoch`)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return run_ranks(_rank_end_epoch, ns["end_epoch"], seed, folder, epoch)


def _same_metrics(got: Any, want: Mapping[str, float]) -> bool:
    return (
        isinstance(got, Mapping)
        and set(got) == set(want)
        and all(math.isclose(got[k], want[k], rel_tol=1e-12, abs_tol=1e-15) for k in want)
    )


def _check_saved(path: Path, seed: int, epoch: int, what: str) -> None:
    import torch

    expect(path.is_file(), f"the checkpoint {what}", expected=f"{path.name} written", got="no file")
    try:
        saved = torch.load(path, weights_only=True)
    except Exception as exc:  # a pickled module, or not a torch file
        raise CheckFailed(
            f"the checkpoint {what}: expected {{'epoch', 'model': state_dict}} readable with "
            f"torch.load(weights_only=True), got {type(exc).__name__}"
        ) from None
    expect(isinstance(saved, dict) and saved.get("epoch") == epoch, f"the epoch stored {what}",
           expected=epoch, got=saved.get("epoch") if isinstance(saved, dict) else saved)  # fmt: skip
    diff = _differs(tiny_model(seed).state_dict(), saved.get("model"))
    expect(not diff, f"the model state stored {what}", expected="that rank's model.state_dict()",
           got=f"other tensors {diff}")  # fmt: skip


def check_end_epoch(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    worker = ctx.worker()
    here, epoch = Path(worker.folder) / f"here-{ctx.seed % 1000}.pt", rng.randint(2, 40)
    got = worker.probe(f"{_P}:probe_end_epoch_here", seed=ctx.seed, path=str(here), epoch=epoch)
    want = rank_metrics(ctx.seed, 0)
    expect(_same_metrics(got, want), "end_epoch on one rank (float64: the mean of one value is "
           "that value, to the last bit)", expected=want, got=got)  # fmt: skip
    _check_saved(here, ctx.seed + 10, epoch, "in one process")
    folder = Path(worker.folder) / f"ranks-{ctx.seed % 1000}"
    epoch = rng.randint(2, 40)
    ranks = worker.probe(f"{_P}:probe_end_epoch_ranks", seed=ctx.seed, folder=str(folder),
                         epoch=epoch)  # fmt: skip
    _rank_failure(ranks, "end_epoch")
    per_rank = [rank_metrics(ctx.seed, r) for r in (0, 1)]
    mean = {k: (per_rank[0][k] + per_rank[1][k]) / 2 for k in sorted(per_rank[0])}
    for r in ranks:
        expect(_same_metrics(r["averaged"], mean),
               f"the metrics end_epoch returns on rank {r['rank']} (each rank passed its own, "
               "in its own insertion order)", expected=f"the mean over the ranks {mean}",
               got=r["averaged"])  # fmt: skip
    written = sorted(p.name for p in folder.iterdir())
    expect(written == ["rank0-model.pt"], "files written when each rank is given its own "
           "checkpoint path", expected="rank 0's only (rank0-model.pt)", got=written)  # fmt: skip
    _check_saved(folder / "rank0-model.pt", ctx.seed + 10, epoch, "by rank 0")


# ------------------------------------------------------------------ exercise 6

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
               "uint8": 1, "int8": 1}  # fmt: skip
_COLUMNS = ("tensor", "phase", "start_ms", "dur_ms", "depth", "bytes")


def synthetic_timeline(rng: random.Random) -> list[dict]:
    """A seeded Horovod timeline: tensors negotiating and reducing in fused groups, a span
    nested two deep, rank markers (one before any span), spans still open at the end."""
    tensors = [f"allreduce.{n}" for n in rng.sample(
        ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "layer1.0.conv.weight",
         "layer1.1.conv.weight", "fc.weight", "fc.bias", "head.weight", "head.bias"],
        rng.randint(4, 6))]  # fmt: skip
    pids = {name: pid for pid, name in enumerate(tensors, start=rng.randint(1, 9))}
    shapes = {name: [rng.randint(1, 40) for _ in range(rng.randint(1, 3))] for name in tensors}
    dtype = {name: rng.choice(["float32", "float16", "float64", "int64"]) for name in tensors}
    t0 = rng.randint(10_000, 900_000)
    events: list[dict] = [{"ph": "X", "name": "0", "ts": t0, "pid": pids[tensors[0]], "dur": 0}]
    t = t0 + rng.randint(5, 400)
    for cycle in range(rng.randint(3, 5)):
        group = rng.sample(tensors, rng.randint(2, len(tensors)))  # rows interleave
        for name in group:
            pid, begin = pids[name], t + rng.randint(0, 300)
            events.append({"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": begin, "pid": pid})
            for r in range(2):
                events.append({"ph": "X", "name": str(r), "ts": begin + r * rng.randint(0, 90),
                               "pid": pid, "dur": 0})  # fmt: skip
        t += 400 + rng.randint(0, 800)
        for name in group:
            events.append({"ph": "E", "ts": t + rng.randint(0, 5), "pid": pids[name]})
        t += 10
        for name in group:
            pid, s = pids[name], t
            nested = [("ALLREDUCE", "B"), ("MEMCPY_IN_FUSION_BUFFER", "B")]
            if rng.random() < 0.5 or (cycle, name) == (0, group[0]):
                nested += [("INIT_FUSION_BUFFER", "B"), ("", "E")]  # two deep
            nested += [("", "E"), ("GLOO_ALLREDUCE", "B"), ("", "E"),
                       ("MEMCPY_OUT_FUSION_BUFFER", "B"), ("", "E")]  # fmt: skip
            for phase, ph in nested:
                s += rng.randint(1, 300)
                events.append({"ph": ph, "ts": s, "pid": pid, **({"name": phase} if phase else {})})
            s += rng.randint(1, 50)
            events.append({"ph": "E", "ts": s, "pid": pid,
                           "args": {"dtype": dtype[name], "shape": str(shapes[name])}})  # fmt: skip
        t = max(e["ts"] for e in events) + rng.randint(50, 500)
    for name in rng.sample(tensors, 2):  # the run stopped while these negotiated
        events.append({"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t + rng.randint(0, 99),
                       "pid": pids[name]})  # fmt: skip
    events.sort(key=lambda e: e["ts"])  # stable: each row keeps its own order
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
            for name, pid in pids.items()]  # fmt: skip
    return meta + events


def expected_spans(events: list[dict]) -> list[dict]:
    """The lab's definition of the closed spans of ``events``."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}  # fmt: skip
    t0 = min(e["ts"] for e in events if "ts" in e)
    stacks: dict[Any, list[dict]] = {}
    rows = []
    for e in events:
        stack = stacks.setdefault(e.get("pid"), [])
        if e.get("ph") == "B":
            stack.append(e)
        elif e.get("ph") == "E" and stack:
            begin, args = stack.pop(), e.get("args", {})
            size = 0
            if "dtype" in args and "shape" in args:
                dims = [int(d) for d in args["shape"].strip("[]").split(",") if d.strip()]
                size = math.prod(dims) * DTYPE_BYTES.get(args["dtype"], 0)
            rows.append({"tensor": names.get(e["pid"], str(e["pid"])), "phase": begin["name"],
                         "start_ms": (begin["ts"] - t0) / 1e3, "dur_ms": (e["ts"] - begin["ts"]) / 1e3,
                         "depth": len(stack), "bytes": size})  # fmt: skip
    return rows


def probe_spans(ns: dict[str, Any], events: list[dict], path: str) -> list[Any]:
    """``timeline_spans`` of ``events``, and of the unterminated file ``path`` via ``load_trace``."""
    out = []
    for frame in (ns["timeline_spans"](events), ns["timeline_spans"](ns["load_trace"](Path(path)))):
        columns = [str(c) for c in getattr(frame, "columns", [])]
        if not set(_COLUMNS) <= set(columns):
            out.append({"columns": columns})
            continue
        out.append({"columns": columns, "rows": [
            {"tensor": str(t), "phase": str(p), "start_ms": float(s), "dur_ms": float(d),
             "depth": int(k), "bytes": int(b)}
            for t, p, s, d, k, b in zip(*(frame[c].tolist() for c in _COLUMNS))]})  # fmt: skip
    return out


def _key(row: Mapping[str, Any]) -> tuple:
    return (round(row["start_ms"], 6), row["tensor"], row["depth"], row["phase"])


def check_spans(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    first, second = synthetic_timeline(rng), synthetic_timeline(rng)
    worker = ctx.worker()
    path = Path(worker.folder) / f"timeline-{ctx.seed % 1000}.json"
    # Rank 0 writes its timeline as it goes: no closing bracket, a trailing comma.
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in second) + ",\n")
    got = worker.probe(f"{_P}:probe_spans", events=first, path=str(path))
    for what, events, found in (("a seeded timeline", first, got[0]),
                                ("an unterminated timeline file read with load_trace", second, got[1])):  # fmt: skip
        expect("rows" in found, f"columns of timeline_spans on {what}", expected=list(_COLUMNS),
               got=found["columns"])  # fmt: skip
        want = sorted(expected_spans(events), key=_key)
        mine = sorted(found["rows"], key=_key)
        expect(len(mine) == len(want), f"spans in {what} (closed B/E pairs only)",
               expected=len(want), got=len(mine))  # fmt: skip
        for w, g in zip(want, mine):
            same = all(
                math.isclose(g[c], w[c], abs_tol=1e-9) if c in ("start_ms", "dur_ms") else g[c] == w[c]
                for c in _COLUMNS
            )  # fmt: skip
            expect(same, f"a span of {what} (start_ms counts from the first event with a ts; "
                   "depth from the spans still open on that row)", expected=w, got=g)  # fmt: skip


# ------------------------------------------------------------------ exercise 7

_NEGOTIATE = ("NEGOTIATE_ALLREDUCE",)
_REDUCE = ("GLOO_ALLREDUCE", "NCCL_ALLREDUCE")
_COPY = ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER")
_EVIDENCE = ("negotiate_ms", "reduce_ms", "copy_ms", "calls_per_step", "bytes_per_call")
_VERDICTS = ("rank-skew", "latency", "bandwidth", "copy")


def expected_diagnosis(rows: list[dict], steps: int, latency_bytes: int) -> dict:
    """The exercise's rules, applied by the judge to the spans ``rows``."""
    grads = [
        r for r in rows if r["tensor"].startswith("allreduce.") and "noname" not in r["tensor"]
    ]

    def per_step(phases: tuple[str, ...]) -> float:
        from ddtk.profiling.intervals import length, union

        return length(union((r["start_ms"], r["start_ms"] + r["dur_ms"])
                            for r in grads if r["phase"] in phases)) / steps  # fmt: skip

    calls = len({round(r["start_ms"], 3) for r in grads if r["phase"] in _REDUCE})
    payload = sum(r["bytes"] for r in grads if r["phase"] == "ALLREDUCE" and r["depth"] == 0)
    got = {"negotiate_ms": per_step(_NEGOTIATE), "reduce_ms": per_step(_REDUCE),
           "copy_ms": per_step(_COPY), "calls_per_step": calls / steps,
           "bytes_per_call": payload / calls if calls else 0.0}  # fmt: skip
    top = max(("negotiate_ms", "reduce_ms", "copy_ms"), key=lambda k: got[k])
    if top == "reduce_ms":
        bound = "latency" if got["bytes_per_call"] < latency_bytes else "bandwidth"
    else:
        bound = "rank-skew" if top == "negotiate_ms" else "copy"
    return {"bound": bound, **got}


def _call_spans(name: str, start: float, plan: dict, fused: bool) -> list[dict]:
    """One tensor's spans in one all-reduce call: the copies only where tensors are fused."""
    cin, red, cout = (
        (plan["copy"] / 2, plan["reduce"], plan["copy"] / 2) if fused else (0, plan["reduce"], 0)
    )
    rows = [{"tensor": name, "phase": "ALLREDUCE", "start_ms": start, "dur_ms": cin + red + cout,
             "depth": 0, "bytes": plan["bytes"][name]},
            {"tensor": name, "phase": plan["reduce_phase"], "start_ms": start + cin, "dur_ms": red,
             "depth": 1, "bytes": 0}]  # fmt: skip
    if fused:
        rows += [{"tensor": name, "phase": "MEMCPY_IN_FUSION_BUFFER", "start_ms": start,
                  "dur_ms": cin, "depth": 1, "bytes": 0},
                 {"tensor": name, "phase": "MEMCPY_OUT_FUSION_BUFFER", "start_ms": start + cin + red,
                  "dur_ms": cout, "depth": 1, "bytes": 0}]  # fmt: skip
    return rows


def _step_spans(rng: random.Random, t: float, plan: dict) -> tuple[list[dict], float]:
    """One step's spans from ``plan``: its calls in order, each tensor negotiating first.

    With ``plan["early"]`` every tensor starts negotiating when the step starts and waits
    for its own call (gradients ready together, reduced one call after another), so the
    negotiations overlap each other; otherwise a call's tensors negotiate just before it.
    """
    rows: list[dict] = []
    step_start = t
    for group in plan["groups"]:
        start = t + plan["negotiate"]
        for i, name in enumerate(group):
            begin = (
                step_start + 0.001 * i
                if plan["early"]
                else t + plan["negotiate"] * i / (2 * len(group))
            )
            rows.append({"tensor": name, "phase": "NEGOTIATE_ALLREDUCE", "start_ms": begin,
                         "dur_ms": start - begin, "depth": 0, "bytes": 0})  # fmt: skip
            rows += _call_spans(name, start, plan, fused=len(group) > 1)
        t = start + plan["reduce"] + (plan["copy"] if len(group) > 1 else 0)
        t += plan["gap"] * rng.uniform(0.5, 1.0)
        if plan["early"]:
            plan = {**plan, "negotiate": 0.0}  # the next call starts as soon as this one ends
    return rows, t


def diagnosis_cases(rng: random.Random) -> list[dict]:
    """Seeded span tables, one per verdict, each with a trap for a plausible mistake:

    - rank skew: a metric all-reduce (``allreduce.noname``) whose long reduce would win if
      counted;
    - latency: six unfused calls one after another, every tensor negotiating from the
      step's start, so negotiations summed instead of unioned would win;
    - bandwidth: the bytes per call are above the threshold and the bytes per tensor
      below it (a call counted once per tensor says latency);
    - copy: the copies win, and a ``broadcast.`` row with more bytes than any call sits
      beside the gradients.

    The threshold is seeded too, so a fixed 256 KiB fails.
    """
    names = [f"allreduce.{n}" for n in ("conv1.weight", "conv1.bias", "layer1.conv.weight",
                                         "layer2.conv.weight", "fc.weight", "fc.bias")]  # fmt: skip
    cases = []
    for bound in rng.sample(_VERDICTS, len(_VERDICTS)):
        # where bandwidth is the answer, a call stays under 256 KiB: a fixed default fails
        kib = [32, 48, 64, 96] if bound == "bandwidth" else [64, 128, 256, 512]
        latency_bytes = rng.choice(kib) * 1024
        steps, tensors, unit = rng.randint(2, 4), rng.sample(names, 6), rng.uniform(0.5, 2.0)
        plan = {"groups": [tensors[:3], tensors[3:]], "reduce_phase": rng.choice(_REDUCE),
                "early": False, "gap": 0.2 * unit}  # fmt: skip
        if bound == "rank-skew":
            plan |= {"negotiate": 3 * unit, "reduce": unit, "copy": 0.3 * unit}
        elif bound == "latency":  # six unfused calls, all negotiating from the step's start
            plan |= {"groups": [[n] for n in tensors], "early": True, "gap": 0.01 * unit,
                     "negotiate": 0.2 * unit, "reduce": unit, "copy": 0.0}  # fmt: skip
        elif bound == "bandwidth":
            plan |= {"negotiate": 0.4 * unit, "reduce": 3 * unit, "copy": 0.5 * unit}
        else:
            plan |= {"negotiate": 0.5 * unit, "reduce": unit, "copy": 2.5 * unit}
        # Bytes per tensor below the threshold; a fused call's sum above it. Where latency
        # is the answer, a call is one tensor, below it.
        share = rng.uniform(0.4, 0.8) if bound != "latency" else rng.uniform(0.05, 0.8)
        plan["bytes"] = {n: int(latency_bytes * share * rng.uniform(0.9, 1.1)) for n in tensors}
        rows, t = [], rng.uniform(0.0, 50.0)
        for _ in range(steps):
            more, t = _step_spans(rng, t, plan)
            rows += more
        if bound == "rank-skew":  # a metric average: not a gradient
            rows += [{"tensor": "allreduce.noname.3", "phase": plan["reduce_phase"], "start_ms": t,
                      "dur_ms": 20 * unit * steps, "depth": 1, "bytes": 0}]  # fmt: skip
        if bound == "copy":
            rows += [{"tensor": "broadcast.fc.weight", "phase": "ALLREDUCE", "start_ms": t,
                      "dur_ms": 0.1, "depth": 0, "bytes": 50 * latency_bytes}]  # fmt: skip
        rng.shuffle(rows)
        cases.append({"rows": rows, "steps": steps, "latency_bytes": latency_bytes,
                      "bound": bound})  # fmt: skip
    return cases


def probe_diagnosis(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``diagnose_allreduce`` on each case's spans (rebuilt as the lab's DataFrame)."""
    pd = ns["pd"]
    out = []
    for case in cases:
        frame = pd.DataFrame(case["rows"], columns=list(_COLUMNS))
        got = ns["diagnose_allreduce"](frame, case["steps"], latency_bytes=case["latency_bytes"])
        out.append({str(k): (v if isinstance(v, str) else float(v)) for k, v in dict(got).items()})
    return out


def check_diagnosis(ctx: Context) -> None:
    cases = diagnosis_cases(random.Random(ctx.seed))
    got = ctx.worker().probe(f"{_P}:probe_diagnosis", cases=cases)
    for case, answer in zip(cases, got):
        want = expected_diagnosis(case["rows"], case["steps"], case["latency_bytes"])
        call = (f"diagnose_allreduce(<seeded spans, {case['steps']} steps>, {case['steps']}, "
                f"latency_bytes={case['latency_bytes']})")  # fmt: skip
        for key in _EVIDENCE:
            value = answer.get(key)
            expect(isinstance(value, float) and math.isclose(value, want[key], rel_tol=1e-6, abs_tol=1e-9),
                   f"{key} of {call} (gradient tensors only; overlapping spans count once; "
                   "tensors fused into one call count as one call)",
                   expected=round(want[key], 6), got=value)  # fmt: skip
        expect(answer.get("bound") == want["bound"], f"the verdict of {call}",
               expected=want["bound"], got=answer.get("bound"))  # fmt: skip


# ------------------------------------------------------------------ exercise 8


def scaling_cases(rng: random.Random) -> list[dict]:
    """Seeded measurements from a known serial fraction s and overhead growth g, where
    X(n) = X(1) n / (1 + s (n - 1) + g (n - 1)^2), so that e(n) = s + g (n - 1) exactly:
    a constant e, a growing one, a host with fewer cores than the processes measured, a
    single process count above 1, and the two inputs that must raise."""

    def runs(counts: list[int], s: float, g: float) -> dict[int, float]:
        x1 = rng.uniform(200, 5000)
        rng.shuffle(counts)  # any insertion order
        return {n: round(x1 * n / (1 + s * (n - 1) + g * (n - 1) ** 2), 6) for n in counts}

    return [
        {"runs": runs([1, 2, 4], rng.uniform(0.02, 0.3), 0.0), "cores": rng.choice([8, 16]),
         "predict": [3, rng.choice([6, 8])]},
        {"runs": runs([1, 2, 4, 8], rng.uniform(0.0, 0.1), rng.uniform(0.02, 0.08)),
         "cores": rng.choice([16, 32]), "predict": [rng.choice([12, 16]), 6]},
        {"runs": runs([1, 2, 4], rng.uniform(0.0, 0.1), rng.uniform(0.04, 0.1)), "cores": 2,
         "predict": [4, 8]},
        {"runs": runs([1, rng.choice([2, 3])], rng.uniform(0.05, 0.3), 0.0), "cores": 4,
         "predict": [4]},
        {"runs": runs([2, 4], 0.1, 0.0), "cores": 8, "predict": [8]},
        {"runs": runs([1], 0.1, 0.0), "cores": 8, "predict": [8]},
    ]  # fmt: skip


def expected_model(case: Mapping[str, Any], delta: float = 0.05) -> dict | str:
    """The exercise's rules, applied by the judge: e(n), trend, limit, predictions."""
    x, cores = case["runs"], case["cores"]
    if 1 not in x or len(x) < 2:
        return "ValueError"
    e = {n: (x[1] / x[n] - 1 / n) / (1 - 1 / n) for n in sorted(x) if n > 1}
    points = [(n, v) for n, v in e.items() if n <= cores] or list(e.items())
    growing = len(points) >= 2 and points[-1][1] - points[0][1] > delta
    ns, vs = [n for n, _ in points], [v for _, v in points]
    slope = 0.0
    if growing:
        mn, mv = sum(ns) / len(ns), sum(vs) / len(vs)
        slope = sum((n - mn) * (v - mv) for n, v in points) / sum((n - mn) ** 2 for n in ns)
    intercept = sum(vs) / len(vs) - slope * sum(ns) / len(ns)

    def amdahl(m: int) -> float:
        f = min(1.0, max(0.0, intercept + slope * m))
        return x[1] * m / (1 + f * (m - 1))

    return {"karp_flatt": {str(n): v for n, v in e.items()},
            "trend": "growing" if growing else "constant",
            "limit": "cores" if max(case["predict"]) > cores else "overhead" if growing else "serial",
            "predicted": {str(n): amdahl(min(n, cores)) for n in case["predict"]}}  # fmt: skip


def probe_model(ns: dict[str, Any], cases: list[dict]) -> list[Any]:
    """``scaling_model`` of each case as plain JSON (keys as strings), or what it raised."""
    out: list[Any] = []
    for case in cases:
        runs = {int(n): v for n, v in case["runs"].items()}
        try:
            got = ns["scaling_model"](runs, case["cores"], list(case["predict"]))
        except ValueError:
            out.append("ValueError")
            continue
        except Exception as exc:
            out.append(_error_text(exc))
            continue
        if not isinstance(got, Mapping):
            out.append(f"a {type(got).__name__}, not a dict")
            continue
        plain = {}
        for key in ("karp_flatt", "predicted"):
            value = got.get(key)
            plain[key] = ({str(n): float(v) for n, v in value.items()}
                          if isinstance(value, Mapping) else repr(value))  # fmt: skip
        plain |= {key: str(got.get(key)) for key in ("trend", "limit")}
        out.append(plain)
    return out


def _close(mine: Any, want: Mapping[str, float]) -> bool:
    return (isinstance(mine, Mapping) and set(mine) == set(want)
            and all(math.isclose(mine[k], v, rel_tol=1e-6, abs_tol=1e-9) for k, v in want.items()))  # fmt: skip


def check_model(ctx: Context) -> None:
    cases = scaling_cases(random.Random(ctx.seed))
    sent = [{**c, "runs": {str(n): v for n, v in c["runs"].items()}} for c in cases]
    got = ctx.worker().probe(f"{_P}:probe_model", cases=sent)
    for case, value in zip(cases, got):
        what = (f"scaling_model of images/s {dict(sorted(case['runs'].items()))} on {case['cores']} "
                f"cores, predicting {case['predict']}")  # fmt: skip
        want = expected_model(case)
        if want == "ValueError" or not isinstance(value, Mapping):
            expect(value == want, what, expected=want if isinstance(want, str) else "a model",
                   got=value)  # fmt: skip
            continue
        rounded = {k: round(v, 6) for k, v in want["karp_flatt"].items()}
        expect(_close(value["karp_flatt"], want["karp_flatt"]), f"e(n) of {what}",
               expected=rounded, got=value["karp_flatt"])  # fmt: skip
        for key in ("trend", "limit"):
            expect(
                value[key] == want[key], f"the {key} of {what}", expected=want[key], got=value[key]
            )
        expect(_close(value["predicted"], want["predicted"]), f"the predictions of {what}",
               expected={k: round(v, 3) for k, v in want["predicted"].items()},
               got=value["predicted"])  # fmt: skip


JUDGE = LabJudge(
    lab="lab02-horovod",
    setup=(("c5eb92c0", "all"), ("2628c985", "imports"), ("l02-busy-ms", "all")),
    exercises={
        1: Exercise(1, "predict where ranks land", ("1b5bee1f",), check_placement,
                    _HOROVOD_RECIPES, _GIVEN),
        2: Exercise(2, "join the job, pin the device, share the cores", ("7576f2dd",), check_setup,
                    _HOROVOD_RECIPES, _GIVEN),
        3: Exercise(3, "scaled learning rate with warm-up", ("17015b3d",), check_lr,
                    _HOROVOD_RECIPES, _GIVEN),
        4: Exercise(4, "broadcast and DistributedOptimizer", ("b780aa0b",), check_distribute,
                    _HOROVOD_RECIPES, _GIVEN),
        5: Exercise(5, "average metrics, rank 0 saves", ("274d414e",), check_end_epoch,
                    _HOROVOD_RECIPES, _GIVEN),
        6: Exercise(6, "read a Horovod timeline", ("6b540593",), check_spans,
                    _TIMELINE_READERS, _GIVEN),
        7: Exercise(7, "diagnose the all-reduce", ("84157591",), check_diagnosis,
                    _TIMELINE_READERS, _GIVEN),
        8: Exercise(8, "what limits scaling", ("3860097d",), check_model, _SCALING, _GIVEN),
    },
)  # fmt: skip


def judge(number: int, namespace: dict[str, Any]) -> None:
    """Run the grader's check of exercise ``number`` here, on this notebook's answer
    (``namespace``: the notebook's ``globals()``), with inputs you have not seen."""
    check_here(JUDGE, number, namespace)


__all__ = ["JUDGE", "judge"]
