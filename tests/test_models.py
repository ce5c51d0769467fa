"""ddtk.models: shapes on a digits batch, seeded weights, parameter counts, errors."""

from __future__ import annotations

import pytest
import torch

from ddtk.data import load_dataset
from ddtk.models import MLP, MODELS, LinearModel, SmallCNN, build_model, count_parameters


@pytest.fixture(scope="module")
def digits_batch() -> torch.Tensor:
    return load_dataset("digits").x[:16]


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("name", "cls"), [("mlp", MLP), ("cnn", SmallCNN), ("linear", LinearModel)]
)
def test_output_shape_on_digits(name: str, cls: type, digits_batch: torch.Tensor) -> None:
    model = build_model(name, input_shape=(1, 8, 8), num_classes=10, seed=0)
    assert isinstance(model, cls)
    out = model(digits_batch)
    assert out.shape == (16, 10) and out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()  # every parameter takes part in the forward pass
    assert all(p.grad is not None for p in model.parameters())
    assert build_model(name, (1, 8, 8), num_classes=1)(digits_batch).shape == (16, 1)


def test_flat_inputs_and_other_shapes() -> None:
    x = torch.randn(5, 20)
    assert build_model("mlp", input_shape=(20,), num_classes=4)(x).shape == (5, 4)
    assert build_model("linear", input_shape=(20,), num_classes=1)(x).shape == (5, 1)
    cnn = build_model("cnn", input_shape=(3, 12, 12), num_classes=7)
    assert cnn(torch.randn(2, 3, 12, 12)).shape == (2, 7)
    wide = build_model("mlp", input_shape=(20,), hidden_dims=(8, 8, 8), num_classes=2)
    assert [m.out_features for m in wide if isinstance(m, torch.nn.Linear)] == [8, 8, 8, 2]


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_weights(name: str) -> None:
    a, b = build_model(name, seed=3), build_model(name, seed=3)
    c = build_model(name, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(_weights(a), _weights(b)))
    assert not all(torch.equal(p, q) for p, q in zip(_weights(a), _weights(c)))


def test_count_parameters() -> None:
    # written out layer by layer: weights + biases
    mlp = (64 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10)
    cnn = (1 * 16 * 9 + 16) + (16 * 32 * 9 + 32) + (32 * 4 * 4 * 64 + 64) + (64 * 10 + 10)
    linear = 64 * 10 + 10
    assert count_parameters(build_model("mlp")) == mlp == 6570
    assert count_parameters(build_model("cnn")) == cnn == 38282
    assert count_parameters(build_model("linear")) == linear == 650
    model = build_model("linear")
    model[1].bias.requires_grad_(False)  # frozen scalars are not counted
    assert count_parameters(model) == 640


def test_unknown_model() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg'; choose one of mlp, cnn, linear, resnet"):
        build_model("vgg")


@pytest.mark.parametrize("shape", [(64,), (8, 8), (1, 8, 6), (1, 1, 8, 8), (1, 1, 1)])
def test_cnn_rejects_non_square_or_flat_shapes(shape: tuple) -> None:
    with pytest.raises(
        ValueError, match=r"the cnn needs a square \(channels, side, side\) input shape"
    ):
        build_model("cnn", input_shape=shape)


def test_resnet_shapes_parameters_and_buffers(digits_batch: torch.Tensor) -> None:
    """The ResNet-style CNN: logits per sample, the documented size, BatchNorm buffers, strided stage."""
    from ddtk.models import ResNetSmall

    model = build_model("resnet")
    assert isinstance(model, ResNetSmall)
    assert model(digits_batch).shape == (16, 10)
    assert count_parameters(model) == 19_706
    assert any("running_mean" in name for name, _ in model.named_buffers())
    assert build_model("resnet", input_shape=(3, 12, 12), num_classes=7)(torch.randn(2, 3, 12, 12)).shape == (2, 7)
    with pytest.raises(ValueError, match="sides >= 2"):
        build_model("resnet", input_shape=(1, 1, 8))
