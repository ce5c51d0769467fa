"""ddtk.monitoring.tensorboard: scalars written by PyTorch's SummaryWriter, read back by TensorBoard's reader.

The files are real TensorBoard event files (``torch.utils.tensorboard``), read with
``EventAccumulator``, the reader the TensorBoard server itself uses; a rank's exporter
writes them too when given a folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import import_or_require

import_or_require("tensorboard", "monitoring")

from ddtk.monitoring.exporter import TrainingMetrics  # noqa: E402
from ddtk.monitoring.tensorboard import TAGS, ScalarWriter, load_scalars  # noqa: E402


def test_scalars_round_trip_in_step_order(tmp_path: Path) -> None:
    writer = ScalarWriter(tmp_path)
    writer.step(2, 0.5, 16, loss=1.25)
    writer.step(1, 0.25, 16, loss=2.0)
    writer.step(3, 0.0, 16, loss=None)  # no loss, and no rate for a zero-length step
    writer.close()
    writer.close()  # twice is fine
    scalars = load_scalars(tmp_path)
    assert scalars["train/loss"] == [(1, 2.0), (2, 1.25)]
    assert scalars["train/step_seconds"] == [(1, 0.25), (2, 0.5), (3, 0.0)]
    assert scalars["train/samples_per_second"] == [(1, 64.0), (2, 32.0)]


def test_a_folder_without_event_files_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}: no TensorBoard event file"):
        load_scalars(tmp_path)


def test_the_exporter_writes_one_run_per_rank(tmp_path: Path) -> None:
    with TrainingMetrics(1, 2, tensorboard_dir=tmp_path) as m:
        for step in range(3):
            m.step(0.1 * (step + 1), 8, loss=3.0 - step)
    scalars = load_scalars(tmp_path / "rank1")
    assert set(scalars) == set(TAGS)
    assert scalars["train/loss"] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert [v for _, v in scalars["train/step_seconds"]] == pytest.approx([0.1, 0.2, 0.3])
    assert not (tmp_path / "rank0").exists()
