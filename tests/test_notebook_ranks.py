"""Lectures 01 and 05 with three ranks, through papermill as ``ddtk course run`` does.

Both run with their defaults under ``pytest --nbval-lax`` too; here the parameters must
really reach the same notebook: a third rank, and fp16 with its loss scaler. Neither
starts Ray, so this file is a group of its own (``tests/scheduling.py``), off the Ray
group that bounds the suite's time.
"""

from __future__ import annotations

import json

import pytest
from support import executed_text

from ddtk.course import catalog
from ddtk.course.run import run_notebook

pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def test_lecture_01_runs_with_three_ranks(tmp_path) -> None:
    nb = catalog.find("01")
    # the third rank is what this run adds (nbval runs the defaults): fewer sizes, iterations
    # and launches keep every cell's code path at a third of the collectives
    small = {"world_size": 3, "sizes_kib": [1, 64, 1024], "compare_sizes_kib": [4, 1024],
             "iters": 4, "scaling_world_sizes": [1, 3], "scaling_steps": 4, "async_rounds": 12}  # fmt: skip
    result = run_notebook(nb.file, small, out_dir=tmp_path, timeout=300)
    assert result.ok, result.failure.describe() if result.failure else result.status
    text = executed_text(result.output)
    executed = json.loads(result.output.read_text())
    sources = "".join("".join(c["source"]) for c in executed["cells"])
    assert "world_size = 3" in sources and "scaling_world_sizes = [1, 3]" in sources
    assert "[rank 2]" in text or "rank 2" in text


def test_lecture_05_runs_with_three_ranks_and_fp16(tmp_path) -> None:
    nb = catalog.find("05")
    small = {"world_size": 3, "dtype": "fp16", "epochs": 1, "scaler_steps": 20,
             "bench_steps": 4, "matmul_sizes": [128], "batch_sizes": [16, 256]}  # fmt: skip
    result = run_notebook(nb.file, small, out_dir=tmp_path, timeout=300)
    assert result.ok, result.failure.describe() if result.failure else result.status
    text = executed_text(result.output)
    assert "autocast dtype=fp16" in text
    assert "scales equal at every step: True" in text
    assert "rank 2: skipped" in text  # the distributed demo ran on three ranks
    assert "fp16 autocast + loss scaler" in text
