"""Pin the private PyTorch DDP functions that lecture 03 and ddtk rely on, so an upgrade shows.

* ``torch.distributed._compute_bucket_assignment_by_size`` (what DDP calls to cut buckets):
  :func:`ddtk.frameworks.ddp_internals.rebuilt_buckets` must predict the buckets the real
  Reducer sends after its rebuild, and the diagram of lecture 03 is drawn from it.
* ``DistributedDataParallel._get_ddp_logging_data()``: DDP's own docstring tells users to
  read ``can_set_static_graph`` there, but torch 2.13 never fills that key during training;
  lecture 03 says so and tests ``static_graph=True`` directly instead.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddtk.frameworks import ddp_internals
from ddtk.frameworks.launchers import free_port
from ddtk.models import build_model


@pytest.fixture
def one_rank_group():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sent_buckets(
    ddp: nn.parallel.DistributedDataParallel, net: nn.Module, steps: int
) -> list[list[int]]:
    """Parameter indices of the buckets the Reducer hands to the comm hook in the last step."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    index = {id(p): i for i, p in enumerate(net.parameters())}
    log: list[tuple[int, list[int]]] = []

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        log.append((bucket.index(), [index[id(p)] for p in bucket.parameters()]))
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    for _ in range(steps):
        log.clear()
        ddp.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
    return [params for _, params in sorted(log)]


@pytest.mark.timeout(120)
def test_rebuilt_buckets_match_the_reducer(one_rank_group) -> None:
    net = build_model("resnet", seed=0)
    cap_mb = 0.02
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=cap_mb)
    sent = _sent_buckets(ddp, net, steps=2)
    shapes = [tuple(p.shape) for p in net.parameters()]
    predicted = ddp_internals.rebuilt_buckets(shapes, ddp.bucket_bytes_cap)
    assert len(sent) > 1, "the Reducer did not rebuild its buckets after the first iteration"
    assert [sorted(b) for b in sent] == [sorted(b) for b in predicted]


@pytest.mark.timeout(120)
def test_ddp_logging_data_has_no_can_set_static_graph_during_training(one_rank_group) -> None:
    """DDP's docstring says to read ``can_set_static_graph`` from this private dict; torch 2.13 never fills it.

    When an upgrade starts reporting it, this test fails: update lecture 03, section 2.
    """

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x)  # self.b is never used

    ddp = nn.parallel.DistributedDataParallel(Branchy(), find_unused_parameters=True)
    for _ in range(12):
        ddp(torch.randn(3, 4)).sum().backward()
    data = ddp._get_ddp_logging_data()
    assert {"bucket_sizes", "unused_parameter_size", "find_unused_parameters"} <= set(data), sorted(
        data
    )
    assert "can_set_static_graph" not in data, (
        "torch now reports can_set_static_graph: update lecture 03"
    )
