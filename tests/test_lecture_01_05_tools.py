"""What lectures 01 and 05 quote from the tools, pinned so that an upgrade shows.

The lectures show error texts, API names and NCCL's tree construction as facts. These
tests check the cheap ones against the installed torch and against ddtk's own code;
the slower live reproductions (two ranks under torchrun) run in the notebooks.
"""

from __future__ import annotations

import datetime
import importlib
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddtk.viz.diagrams.collectives import binomial_tree_rounds, btree, double_binary_tree


def _children(parents: dict[int, int]) -> dict[int, set[int]]:
    kids: dict[int, set[int]] = {r: set() for r in parents}
    for r, p in parents.items():
        if p >= 0:
            kids[p].add(r)
    return kids


def test_btree_matches_the_illustration_in_nccl_trees_cc() -> None:
    """``src/graph/trees.cc`` draws the 14-rank tree: 0-8, 8: 4 12, 4: 2 6, 12: 10 13, ..."""
    parents = {r: btree(14, r)[0] for r in range(14)}
    kids = _children(parents)
    assert parents[0] == -1 and kids[0] == {8}
    assert kids[8] == {4, 12} and kids[4] == {2, 6} and kids[12] == {10, 13}
    assert kids[2] == {1, 3} and kids[6] == {5, 7} and kids[10] == {9, 11}


@pytest.mark.parametrize("nranks", range(2, 34))
def test_double_binary_tree_is_two_spanning_trees_with_disjoint_interiors(nranks: int) -> None:
    trees = double_binary_tree(nranks)
    interiors = []
    for parents in trees:
        assert sorted(parents) == list(range(nranks))
        assert sum(p < 0 for p in parents.values()) == 1  # one root
        kids = _children(parents)
        assert all(len(k) <= 2 for k in kids.values())  # binary
        interiors.append({r for r, k in kids.items() if k})
    if nranks % 2 == 0:  # the mirrored case: no node forwards in both trees
        assert not interiors[0] & interiors[1]


def test_dtree_roots_follow_ncclGetDtreeRoots() -> None:
    for nranks, second_root in ((8, 7), (7, 1), (12, 11), (13, 1)):
        roots = [next(r for r, p in t.items() if p < 0) for t in double_binary_tree(nranks)]
        assert roots == [0, second_root]


def test_ddtk_tree_all_reduce_takes_two_log2_n_rounds() -> None:
    reduce_msgs, bcast_msgs = binomial_tree_rounds(8)
    assert max(t for t, _, _ in reduce_msgs) == 3 and max(t for t, _, _ in bcast_msgs) == 3
    assert len(reduce_msgs) == len(bcast_msgs) == 7  # n - 1 messages per phase
    assert {dst for _, _, dst in reduce_msgs} <= {0, 2, 4, 6}


def test_gradscaler_refuses_fp16_gradients_with_the_quoted_text() -> None:
    model = nn.Linear(4, 2).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.randn(3, 4).half()).float().sum()).backward()
    with pytest.raises(ValueError, match=r"^Attempting to unscale FP16 gradients\.$"):
        scaler.unscale_(opt)


def test_tcpstore_on_a_taken_port_says_address_already_in_use() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(dist.DistNetworkError, match="address already in use"):
            dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=1))


def test_the_single_tensor_collectives_exist_under_one_of_their_names() -> None:
    """Lecture 01 uses the 2.13 names and falls back to the older ones."""
    assert hasattr(dist, "reduce_scatter_single") or hasattr(dist, "reduce_scatter_tensor")
    assert hasattr(dist, "all_gather_single") or hasattr(dist, "all_gather_into_tensor")


def test_the_flight_recorder_analyser_is_importable() -> None:
    """Lecture 01 names ``torch.distributed.flight_recorder.fr_trace`` (``torchfrtrace``)."""
    module = importlib.import_module("torch.distributed.flight_recorder.fr_trace")
    assert callable(module.main)


def test_torchrun_script_returns_the_command_and_each_ranks_lines_in_rank_order() -> None:
    from ddtk.frameworks.launchers import torchrun_script

    # Unflushed and in pieces, as a rank's prints really come: over one shared pipe, another
    # rank's line could land inside this one ("[rank 0] of 3[rank 2] of 3").
    source = (
        "import os, sys, time\n"
        "rank = int(os.environ['RANK'])\n"
        "for what in (f'of {os.environ[\"WORLD_SIZE\"]}', 'second line'):\n"
        "    sys.stdout.write(f'[rank {rank}] ')\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.05)\n"
        "    print(what)\n"
        "print('not a rank line')\n"
        "print('[rank 9] on stderr', file=sys.stderr)\n"
        "sys.exit(int(os.environ.get('CODE', '0')))\n"
    )
    cmd, lines = torchrun_script(source, nproc=3, timeout=120)
    assert "--rdzv-backend" in cmd and "--nproc-per-node" in cmd and "--redirects" in cmd
    assert lines == [f"[rank {r}] {what}" for r in range(3)
                     for what in ("of 3", "second line")]  # fmt: skip
    _cmd, lines = torchrun_script(source, nproc=1, env={"CODE": "3"}, timeout=120)
    assert lines == ["[rank 0] of 1", "[rank 0] second line"]  # a failing job is returned with what it printed, not raised
