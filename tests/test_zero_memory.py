"""DeepSpeed ZeRO memory per rank, measured in a real ``torchrun`` job, against the formula."""

from __future__ import annotations

import pytest
import torch

from ddtk.frameworks import zero_memory
from ddtk.frameworks.deepspeed_shm import PREFIX, SHM_DIR


def test_covered_bytes_counts_views_once() -> None:
    flat = torch.zeros(100)
    assert zero_memory.covered_bytes([flat, flat[10:20], flat[50:]]) == 400
    assert zero_memory.covered_bytes([flat[:10], flat[90:]]) == 80


def test_config_partitions_small_parameters_in_stage_3() -> None:
    cfg = zero_memory.ds_config(3, offload=True)
    assert cfg["zero_optimization"]["stage3_param_persistence_threshold"] == 0
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_deepspeed_stages_shard_what_the_paper_says(own_tempdir) -> None:
    pytest.importorskip("deepspeed")
    before = set(SHM_DIR.glob(f"{PREFIX}_*"))
    rows = {r["stage"]: r for r in zero_memory.run_zero_memory(stages=(1, 3), steps=2, echo=False)}
    assert not list(own_tempdir.glob("zero-mem-*"))  # the job's result folder is removed
    assert set(SHM_DIR.glob(f"{PREFIX}_*")) <= before  # DeepSpeed's CPU all-reduce segments removed
    n = rows[1]["parameters_count"]
    for r in rows.values():
        assert r["optimizer_state"] == pytest.approx(8 * n / 2, abs=16)  # Adam moments, halved
        assert r["master"] == pytest.approx(4 * n / 2, abs=16)
    assert rows[1]["parameters"] == 4 * n  # stage 1: full parameters
    assert rows[3]["parameters"] == pytest.approx(4 * n / 2, abs=16)  # stage 3: a partition
    assert rows[1]["loss"] == pytest.approx(rows[3]["loss"])


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_ddtk_zero_rows() -> None:
    rows = zero_memory.ddtk_zero_rows(world_size=2, stages=(0, 1))
    assert rows[1]["optimizer_state"] < rows[0]["optimizer_state"]
