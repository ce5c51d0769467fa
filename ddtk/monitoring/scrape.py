"""TensorBoard scalars without TensorBoard: the event files a ``tensorboardX.SummaryWriter`` wrote.

:func:`read_scalars` parses their TFRecord framing (length, CRC, record, CRC), so a
notebook can show what TensorBoard would plot without starting TensorBoard, and a judge
can read what a learner's training loop logged.

>>> import tempfile
>>> from tensorboardX import SummaryWriter
>>> folder = tempfile.mkdtemp()
>>> with SummaryWriter(folder) as w:
...     w.add_scalar("train/loss", 0.5, 1)
>>> read_scalars(folder)["train/loss"]
[(1, 0.5)]
"""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

__all__ = ["read_scalars"]


def _records(path: Path) -> list[bytes]:
    """The records of one TFRecord file (length-prefixed, each with CRCs that are not checked)."""
    data, records, pos = path.read_bytes(), [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        start = pos + 12
        records.append(data[start : start + length])
        pos = start + length + 4
    return records


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``logdir``: tag -> [(step, value)]."""
    from tensorboardX.proto import event_pb2

    files = sorted(Path(logdir).rglob("events.out.tfevents.*"))
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files under {logdir}")
    scalars: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in files:
        for record in _records(path):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars[value.tag].append((int(event.step), float(value.simple_value)))
    return {tag: sorted(points) for tag, points in scalars.items()}
