"""``ddtk.examples.softmax_tuning``: the model every searcher of lecture 2 and its appendix trains."""

from __future__ import annotations

import numpy as np
import pytest

from ddtk.examples.softmax_tuning import LOSS_CAP, heldout_loss, sgd_epoch, softmax, tuning_split


def _data(n: int = 50, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return tuning_split(rng.random((n, 8, 8)), rng.integers(0, 10, n))


def test_softmax_rows_sum_to_one_without_overflow() -> None:
    p = softmax(np.array([[1e4, 0.0, -1e4], [1.0, 1.0, 1.0]]))
    assert np.allclose(p.sum(1), 1.0) and np.isfinite(p).all()
    assert np.allclose(p[1], 1 / 3)


def test_sgd_epoch_is_reproducible_and_lowers_the_training_loss() -> None:
    d = _data(200)
    runs = []
    for _ in range(2):
        W, b, rng = np.zeros((64, 10)), np.zeros(10), np.random.default_rng(3)
        before = heldout_loss(W, b, d["xtr"], d["ytr"])
        for _ in range(5):
            sgd_epoch(W, b, d["xtr"], d["ytr"], lr=0.5, wd=0.0, batch=16, rng=rng)
        runs.append((W.copy(), heldout_loss(W, b, d["xtr"], d["ytr"])))
    assert np.array_equal(runs[0][0], runs[1][0])  # same seed, same weights
    assert runs[0][1] < before == pytest.approx(np.log(10))


def test_a_diverged_run_scores_the_cap() -> None:
    d = _data()
    W, b = np.full((64, 10), np.nan), np.zeros(10)
    assert heldout_loss(W, b, d["xva"], d["yva"]) == LOSS_CAP
    W, b, rng = np.zeros((64, 10)), np.zeros(10), np.random.default_rng(0)
    with np.errstate(all="ignore"):
        for _ in range(3):
            sgd_epoch(W, b, d["xtr"], d["ytr"], lr=1e6, wd=0.0, batch=4, rng=rng)
    assert heldout_loss(W, b, d["xva"], d["yva"]) <= LOSS_CAP


def test_the_split_keeps_order_and_refuses_bad_input() -> None:
    x, y = np.arange(10 * 64).reshape(10, 8, 8), np.arange(10)
    d = tuning_split(x, y, 0.8)
    assert d["xtr"].shape == (8, 64) and list(d["yva"]) == [8, 9]
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        tuning_split(x, y, 1.0)
    with pytest.raises(ValueError, match="10 images but 9 labels"):
        tuning_split(x, y[:9])
    with pytest.raises(ValueError, match="too few"):
        tuning_split(x[:1], y[:1], 0.5)
    with pytest.raises(ValueError, match="batch must be"):
        sgd_epoch(
            np.zeros((64, 10)),
            np.zeros(10),
            d["xtr"],
            d["ytr"],
            0.1,
            0.0,
            0,
            np.random.default_rng(),
        )
