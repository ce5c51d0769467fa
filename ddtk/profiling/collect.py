"""Profile a window of training steps in every rank, one Chrome trace per rank.

:class:`StepProfiler` wraps ``torch.profiler.profile`` with a schedule: skip ``wait``
steps (start-up: the first all-reduce builds gloo's pairs, DDP rebuilds its buckets
after step 1), record ``warmup`` steps and throw them away (the profiler's own
start-up cost), then record ``active`` steps and write them as
``<out_dir>/rank<r>.json``. The same object works wherever the rank runs:

* a rank of :func:`ddtk.launch` or of ``torchrun``: the rank comes from
  ``torch.distributed`` (or from ``RANK`` before the process group exists);
* a Ray Train worker: ``TorchTrainer`` initialises ``torch.distributed`` in every
  worker, so the same lookup finds it (``ray.train.get_context()`` is the fallback);
* a single process: rank 0.

On CPU with gloo the trace holds each collective twice: ``c10d::allreduce_`` where the
training thread issues it and ``gloo:all_reduce`` on the gloo thread that runs it,
with the message's shape when ``record_shapes`` is on. ``distributedInfo`` at the top
of the file names the backend, the rank and the world size. Open a trace in
https://ui.perfetto.dev or ``chrome://tracing``; analyse a folder of them with
:func:`ddtk.profiling.analyse`.

>>> import tempfile, torch
>>> out = tempfile.mkdtemp()
>>> with StepProfiler(out, wait=0, warmup=1, active=2) as prof:
...     for _ in range(3):
...         _ = torch.randn(64, 64).sum()
...         prof.step()
>>> sorted(p.name for p in prof.written)
['rank0.json']
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["StepProfiler", "current_rank", "region"]

REGIONS = ("data", "optimizer", "comm", "compute")


def current_rank() -> int:
    """This process's rank: torch.distributed, then ``RANK``, then Ray Train, else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    if os.environ.get("RANK", "").isdigit():
        return int(os.environ["RANK"])
    with contextlib.suppress(Exception):
        import ray.train

        return int(ray.train.get_context().get_world_rank())
    return 0


@contextlib.contextmanager
def region(kind: str) -> Iterator[None]:
    """Label a block of a training step as ``data``, ``optimizer``, ``comm`` or ``compute``.

    PyTorch names its data loader, optimizers and collectives itself; use this for
    code it cannot recognise, such as batches read by hand from a queue
    (``with region("data"): batch = next(stream)``) or a hand-written all-reduce.
    """
    if kind not in REGIONS:
        raise ValueError(f"region kind must be one of {', '.join(REGIONS)}, got {kind!r}")
    from torch.profiler import record_function

    with record_function(f"ddtk:{kind}"):
        yield


def _positive(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class StepProfiler:
    """``torch.profiler`` over steps ``wait + warmup`` to ``wait + warmup + active - 1``.

    Args:
        out_dir: folder for the trace; created if missing.
        wait, warmup, active: the schedule, in steps (call :meth:`step` once per step).
        rank: the file is ``rank<rank>.json``; default :func:`current_rank`.
        record_shapes: keep operator input shapes and dtypes (gives collective message
            sizes and the precision of matrix multiplies; costs a little more).
        cuda: also record CUDA kernels (default: when CUDA is available).
        enabled: False makes every call a no-op, to time the same loop unprofiled.

    After the window closes, ``written`` lists the trace files.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        rank: int | None = None,
        record_shapes: bool = True,
        cuda: bool | None = None,
        enabled: bool = True,
    ) -> None:
        self.wait = _positive("wait", wait, 0)
        self.warmup = _positive("warmup", warmup, 0)
        self.active = _positive("active", active, 1)
        self.out_dir = Path(out_dir)
        self.rank = rank
        self.record_shapes = record_shapes
        self.cuda = cuda
        self.enabled = enabled
        self.written: list[Path] = []
        self._prof: Any = None

    @property
    def steps_needed(self) -> int:
        """Steps the loop must run for the window to complete."""
        return self.wait + self.warmup + self.active

    def _write(self, prof: Any) -> None:
        rank = current_rank() if self.rank is None else self.rank
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{rank}.json"
        tmp = path.with_suffix(".json.tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)  # a reader never sees half a trace
        self.written.append(path)

    def __enter__(self) -> StepProfiler:
        if not self.enabled:
            return self
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if self.cuda if self.cuda is not None else torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._write,
            record_shapes=self.record_shapes,
        )
        self._prof.__enter__()
        return self

    def step(self) -> None:
        """Mark the end of one training step."""
        if self._prof is not None:
            self._prof.step()

    def __exit__(self, *exc: Any) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.__exit__(*exc)
