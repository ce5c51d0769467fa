"""ddtk.examples.fsdp2_demo on two gloo ranks: FSDP2 shards the parameters and trains like the unsharded model.

One launch runs both precisions on the same ranks. With the fp32 policy the sharded
run must reproduce the single-process run on the whole batch to rounding (gradients
are reduce-scattered as means, SGD steps the shards); with bf16 compute it must stay
within bf16's precision. The parameters must be DTensors sharded on dim 0.
"""

from __future__ import annotations

import ddtk
from ddtk.examples import fsdp2_demo


def _both_precisions(ctx, steps: int) -> dict:
    return {p: fsdp2_demo.train(steps, p) for p in ("fp32", "bf16")}


def test_fsdp2_matches_the_unsharded_model_on_two_ranks() -> None:
    steps = 3
    ranks = ddtk.launch(_both_precisions, 2, args=(steps,), backend="gloo", timeout=180, echo=False)
    reference = fsdp2_demo.reference_losses(steps)
    for rank, out in enumerate(ranks):
        fp32, bf16 = out["fp32"], out["bf16"]
        assert fp32["type"] == "DTensor", fp32
        assert fp32["placements"] == "(Shard(dim=0),)", fp32["placements"]
        assert fp32["global_shape"] == (fsdp2_demo.DIM, fsdp2_demo.DIM)
        assert fp32["local_shape"] == (fsdp2_demo.DIM // 2, fsdp2_demo.DIM), (
            f"rank {rank}: {fp32['local_shape']}"
        )
        assert bf16["dtype"] == "torch.float32", (
            "the sharded parameters stay fp32 under the bf16 policy"
        )
        for step, (got, want) in enumerate(zip(fp32["losses"], reference)):
            assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (
                f"fp32 step {step}: {got} vs unsharded {want}"
            )
        for step, (got, want) in enumerate(zip(bf16["losses"], reference)):
            assert abs(got - want) <= 3e-2 * max(1.0, abs(want)), (
                f"bf16 step {step}: {got} vs unsharded {want}"
            )
    assert ranks[0]["fp32"]["losses"] == ranks[1]["fp32"]["losses"], (
        "ranks report the same global loss"
    )
