"""``algorithm="torch"``: delegate to ``torch.distributed.all_reduce``.

This is the production implementation (gloo's ring on CPU, NCCL on GPU) that
every ddtk algorithm is tested and benchmarked against. Its bytes do not pass
through the ddtk transport, so ``ctx.stats`` records its time but not its bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddtk.comm.ops import ReduceOp, finish_

_TORCH_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,  # gloo has no AVG: sum, then divide like ddtk does
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
}


def all_reduce(
    tensor: torch.Tensor, op: ReduceOp, world_size: int, device: torch.device, backend: str
) -> torch.Tensor:
    """All-reduce a copy of ``tensor`` with torch.distributed; returns a new tensor."""
    out = tensor.detach().to(device=device, copy=True).contiguous()
    if out.numel() == 0:
        return out
    if backend == "gloo" and out.dtype is torch.bfloat16:
        # gloo cannot reduce bfloat16 on CPU: reduce in float32 and round once.
        wide = out.float()
        dist.all_reduce(wide, op=_TORCH_OPS[op])
        out.copy_(wide)
    else:
        dist.all_reduce(out, op=_TORCH_OPS[op])
    return finish_(out, op, world_size)
