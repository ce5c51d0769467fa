"""TensorBoard scalars: written with PyTorch's ``SummaryWriter``, read back with TensorBoard's own reader.

Prometheus keeps a job's *operational* metrics (is it alive, how fast, which rank is
slow) for the cluster's on-call; TensorBoard keeps a run's *training curves* (loss,
learning rate, throughput by step) for the person training the model, as event files
next to the run. :class:`ScalarWriter` writes one rank's scalars with
``torch.utils.tensorboard.SummaryWriter`` into ``<logdir>/rank<r>`` (each rank is a
"run" in TensorBoard); :func:`load_scalars` reads a run folder back with
``tensorboard.backend.event_processing.event_accumulator.EventAccumulator``, the reader
the TensorBoard server uses. Look at the curves with::

    tensorboard --logdir LOGDIR --port 6006     # then open http://localhost:6006

(on a cluster: the log folder on shared storage, and ``ssh -L 6006:localhost:6006`` to
the node that runs ``tensorboard``, or ``kubectl port-forward``).

>>> import tempfile
>>> run = tempfile.mkdtemp()
>>> writer = ScalarWriter(run)
>>> writer.step(1, seconds=0.5, samples=32, loss=2.0)
>>> writer.step(2, seconds=0.25, samples=32, loss=1.5)
>>> writer.close()
>>> load_scalars(run)["train/samples_per_second"]
[(1, 64.0), (2, 128.0)]
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

__all__ = ["TAGS", "ScalarWriter", "load_scalars"]

TAGS = ("train/loss", "train/step_seconds", "train/samples_per_second")


def _without_tensorflow() -> None:
    """Let TensorBoard use its own TensorFlow stub: with TensorFlow installed, its readers and
    writers would import all of it (about 7 s on 2 cores) to write and read event files,
    which need none of it. An importable ``tensorboard.compat.notf`` is the switch that
    TensorBoard's own no-TensorFlow build uses; it changes nothing where TensorFlow is
    already imported."""
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class ScalarWriter:
    """One rank's training curves: loss, step time and samples per second, per step."""

    def __init__(self, logdir: str | Path) -> None:
        _without_tensorflow()
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = Path(logdir)
        self._writer = SummaryWriter(log_dir=str(self.logdir))

    def step(self, step: int, seconds: float, samples: int, loss: float | None) -> None:
        """Write the scalars of step ``step``."""
        if loss is not None:
            self._writer.add_scalar(TAGS[0], float(loss), step)
        self._writer.add_scalar(TAGS[1], seconds, step)
        if seconds > 0:
            self._writer.add_scalar(TAGS[2], samples / seconds, step)

    def close(self) -> None:
        """Flush the event file and close it. Safe twice."""
        self._writer.close()


def load_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of one run folder: ``{tag: [(step, value), ...]}``, in step order.

    Raises ``FileNotFoundError`` when the folder holds no event file.
    """
    _without_tensorflow()
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    run_dir = Path(run_dir)
    if not any(run_dir.glob("events.out.tfevents.*")):
        raise FileNotFoundError(f"{run_dir}: no TensorBoard event file (events.out.tfevents.*)")
    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})  # 0: keep every point
    acc.Reload()
    return {
        tag: [(e.step, e.value) for e in sorted(acc.Scalars(tag), key=lambda e: e.step)]
        for tag in acc.Tags()[SCALARS]
    }
