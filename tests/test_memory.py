"""Memory: measurements, the calculator against them, activation checkpointing, the benchmark."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from ddtk.memory import calculator as calc
from ddtk.memory.activation_checkpointing import CheckpointedTransformer, checkpoint_blocks, sweep
from ddtk.memory.measure import (
    optimizer_state_bytes,
    peak_memory_bytes,
    record_saved_tensors,
    retained_bytes,
    saved_activation_bytes,
    tensor_bytes,
)
from ddtk.models import TinyTransformer, build_model, count_parameters

# (vocab, seq_len, hidden, heads, layers, ffn_mult, batch): odd sizes included
SHAPES = [(64, 16, 32, 4, 2, 4, 3), (50, 12, 24, 3, 3, 2, 5), (37, 7, 18, 2, 1, 3, 1)]


def _setup(shape, seed=0):
    vocab, seq, hidden, heads, layers, f, batch = shape
    torch.manual_seed(seed)
    model = TinyTransformer(vocab, seq, hidden, heads, layers, f)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g)
    targets = torch.randint(0, vocab, (batch, seq), generator=g)
    cfg = calc.TransformerConfig(layers=layers, hidden=hidden, heads=heads, seq_len=seq,
                                 micro_batch=batch, vocab=vocab, ffn_mult=f)  # fmt: skip
    return model, tokens, targets, cfg


def _loss(model, tokens, targets):
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- measure -------------------------------------------------------------------------------------
def test_saved_bytes_count_each_storage_once_and_skip_excluded() -> None:
    lin1, lin2 = torch.nn.Linear(10, 20), torch.nn.Linear(20, 5)
    x = torch.randn(7, 10)
    _, saved = record_saved_tensors(
        lambda: lin2(torch.relu(lin1(x))), exclude=[*lin1.parameters(), *lin2.parameters()]
    )
    # x (kept by lin1) and the ReLU output (kept by ReLU and by lin2: one storage)
    assert sorted(s.nbytes for s in saved) == [7 * 10 * 4, 7 * 20 * 4]
    with_params = saved_activation_bytes(lambda: lin2(torch.relu(lin1(x))))
    assert with_params > 7 * 30 * 4  # the weights are saved too when not excluded


def test_tensor_and_optimizer_state_bytes() -> None:
    model = build_model("mlp", seed=0)
    n = count_parameters(model)
    for opt, per_param in ((torch.optim.Adam(model.parameters()), 8),
                           (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), 4),
                           (torch.optim.SGD(model.parameters(), lr=0.1), 0)):  # fmt: skip
        model.zero_grad()
        F.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 3])).backward()
        opt.step()
        assert optimizer_state_bytes(opt) == per_param * n
    assert tensor_bytes(p.grad for p in model.parameters()) == 4 * n
    assert tensor_bytes([torch.zeros(3, dtype=torch.float16), None]) == 6


def test_peak_and_retained_bytes_on_cpu() -> None:
    assert peak_memory_bytes(lambda: torch.empty(1000)) == 4000  # allocated then freed
    assert peak_memory_bytes(lambda: [torch.empty(1000), torch.empty(500)]) == 6000
    _, kept = retained_bytes(lambda: (torch.empty(250), torch.empty(100)[:10].clone()))
    assert kept == 1000 + 40
    with pytest.raises(ValueError, match="cpu or cuda"):
        peak_memory_bytes(lambda: None, device="meta")


@pytest.mark.gpu
def test_peak_memory_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the CUDA path of peak_memory_bytes needs one")
    assert peak_memory_bytes(lambda: torch.empty(1 << 20, device="cuda"), device="cuda") >= 4 << 20


# -- calculator against measurement ------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_calculator_matches_the_tiny_transformer_exactly(shape) -> None:
    model, tokens, targets, cfg = _setup(shape)
    assert cfg.parameters == count_parameters(model)
    loss = None

    def forward():
        nonlocal loss
        loss = _loss(model, tokens, targets)

    measured = saved_activation_bytes(forward, exclude=model.parameters())
    est = calc.estimate(cfg)
    # every tensor the blocks and the loss save is in the formula: no tolerance needed
    assert measured == est.activation_bytes
    opt = torch.optim.Adam(model.parameters())
    loss.backward()
    opt.step()
    assert tensor_bytes(model.parameters()) == est.params_bytes
    assert tensor_bytes(p.grad for p in model.parameters()) == est.grads_bytes
    assert optimizer_state_bytes(opt) == est.optimizer_bytes


def test_block_activations_match_the_per_layer_formula() -> None:
    model, _, _, cfg = _setup(SHAPES[0])
    x = torch.randn(cfg.micro_batch, cfg.seq_len, cfg.hidden, requires_grad=True)
    block = model.blocks[0]
    measured = saved_activation_bytes(lambda: block(x), exclude=block.parameters())
    s, b, h, a = cfg.seq_len, cfg.micro_batch, cfg.hidden, cfg.heads
    # 8 sbh + 2f sbh fp32 elements, the attention probabilities, LayerNorm mean/rstd
    assert measured == 4 * (16 * s * b * h + a * s * s * b) + 4 * 4 * s * b
    assert measured == calc.layer_activation_bytes(cfg)


def test_small_model_formulas() -> None:
    for hidden in ((64, 32), (17,), ()):
        model = build_model("mlp", hidden_dims=hidden, seed=0)
        assert calc.mlp_parameter_count(64, hidden, 10) == count_parameters(model)
        x, y = torch.randn(5, 1, 8, 8), torch.randint(0, 10, (5,))
        measured = saved_activation_bytes(
            lambda m=model, x=x, y=y: F.cross_entropy(m(x), y), model.parameters()
        )
        assert measured == calc.mlp_activation_bytes(5, 64, hidden, 10)
    assert calc.cnn_parameter_count() == count_parameters(build_model("cnn")) == 38282


def test_korthikanti_formulas() -> None:
    s, b, h, a, t = 2048, 4, 4096, 32, 8
    cfg = calc.TransformerConfig(layers=1, hidden=h, heads=a, seq_len=s, micro_batch=b,
                                 vocab=51200, mixed_precision=True, dropout=True)  # fmt: skip
    stats = 4 * s * b * 4
    assert calc.layer_activation_bytes(cfg) == s * b * h * (34 + 5 * a * s / h) + stats
    tp = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + stats
    assert calc.layer_activation_bytes(cfg, tp=t) == tp
    sp = s * b * h * (34 / t + 5 * a * s / (h * t)) + stats / t
    assert calc.layer_activation_bytes(cfg, tp=t, sequence_parallel=True) == sp


def test_sharded_strategies() -> None:
    model, _, _, cfg = _setup(SHAPES[0])
    p = cfg.parameters
    assert calc.estimate(cfg, dp=3, zero=1).optimizer_bytes == 8 * math.ceil(p / 3)
    z2 = calc.estimate(cfg, dp=3, zero=2)
    assert (z2.grads_bytes, z2.params_bytes) == (4 * math.ceil(p / 3), 4 * p)
    assert calc.estimate(cfg, dp=3, zero=3).params_bytes == 4 * math.ceil(p / 3)
    # Megatron TP over 2 ranks: what each rank holds, counted from the real modules
    sharded = ("qkv", "fc1", "tok_emb", "head")
    held = 0
    for name, prm in model.named_parameters():
        split = any(k in name for k in sharded) or (
            name.endswith("weight") and ("proj" in name or "fc2" in name)
        )
        held += prm.numel() // 2 if split else prm.numel()
    assert calc.estimate(cfg, tp=2).parameters == held
    per_layer = calc.layer_activation_bytes(cfg)
    head = calc.head_activation_bytes(cfg)
    gpipe = calc.estimate(cfg, pp=2, schedule="gpipe", microbatches=4)
    assert gpipe.activation_bytes == 4 * (per_layer + head) and gpipe.stage == 1
    one_f_one_b = calc.estimate(cfg, pp=2, schedule="1f1b", microbatches=4)
    assert one_f_one_b.activation_bytes == max(2 * per_layer, per_layer + head)
    names = [e.strategy for e in calc.compare_strategies(cfg, 2)]
    assert names[:6] == ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "TP", "TP+SP"]
    totals = {e.strategy: e.total for e in calc.compare_strategies(cfg, 2)}
    assert totals["DP"] > totals["ZeRO-1"] > totals["ZeRO-2"] > totals["ZeRO-3"]


def test_calculator_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="divisible"):
        calc.TransformerConfig(layers=1, hidden=30, heads=4, seq_len=8, micro_batch=1, vocab=8)
    cfg = calc.TransformerConfig(layers=2, hidden=32, heads=4, seq_len=8, micro_batch=1, vocab=8)
    for kwargs, match in (({"tp": 3}, "tp=3"), ({"zero": 4}, "zero"), ({"pp": 3}, "pp=3"),
                          ({"schedule": "x"}, "schedule"), ({"dp": 0}, "dp")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            calc.estimate(cfg, **kwargs)
    with pytest.raises(ValueError, match="optimizer"):
        calc.TransformerConfig(
            layers=1, hidden=8, heads=2, seq_len=8, micro_batch=1, vocab=8, optimizer="lamb"
        )


# -- activation checkpointing ---------------------------------------------------------------------
@pytest.mark.parametrize("every", [1, 2, 3])
def test_checkpointing_keeps_gradients_and_saves_memory(every: int) -> None:
    model, tokens, targets, _ = _setup((32, 8, 16, 2, 4, 4, 2))
    plain_loss, plain_kept = retained_bytes(lambda: _loss(model, tokens, targets))
    plain_loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    wrapped = CheckpointedTransformer(model, every)
    loss, kept = retained_bytes(lambda: _loss(wrapped, tokens, targets))
    loss.backward()
    torch.testing.assert_close(loss, plain_loss)
    for got, ref in zip([p.grad for p in model.parameters()], want, strict=True):
        torch.testing.assert_close(got, ref)
    assert kept < plain_kept


def test_checkpoint_sweep_rows_and_errors() -> None:
    rows = sweep((0, 1, 4), layers=4, hidden=16, heads=2, seq_len=16, batch=2, vocab=16, repeats=1)
    assert [r["every"] for r in rows] == [0, 1, 4]
    assert rows[0]["retained_bytes_ratio"] == 1.0
    assert rows[1]["retained_bytes"] < rows[0]["retained_bytes"]
    assert rows[1]["peak_bytes"] < rows[0]["peak_bytes"]
    with pytest.raises(ValueError, match="every"):
        checkpoint_blocks([], torch.zeros(1), -1)
    with pytest.raises(TypeError, match="TinyTransformer"):
        CheckpointedTransformer(build_model("mlp"), 1)


# -- benchmark -------------------------------------------------------------------------------------
def test_bench_runs_on_a_tiny_configuration(tmp_path) -> None:
    import argparse
    import json

    from ddtk.bench import memory as bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["memory", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8",
                              "--batch", "2", "--vocab", "16", "--every", "1", "--repeats", "1",
                              "--json", str(tmp_path / "m.json"), "--plot", str(tmp_path / "m.png")])  # fmt: skip
    assert args.func(args) == 0
    rows = json.loads((tmp_path / "m.json").read_text())["rows"]
    calc_rows = [r for r in rows if r["part"] == "calculator" and r["ratio"] is not None]
    assert calc_rows and all(r["ratio"] == 1.0 for r in calc_rows)
    assert [r["every"] for r in rows if r["part"] == "checkpointing"] == [0, 1]
    assert (tmp_path / "m.png").stat().st_size > 0
    bad = parser.parse_args(["memory", "--hidden", "10", "--heads", "4"])
    assert bad.func(bad) == 2
