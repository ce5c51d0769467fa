"""The tuning problem of lecture 2 and its appendix: softmax regression on digits, in numpy.

A trial of a hyperparameter search should cost well under a second here, so that a search
of tens of trials fits a notebook, yet its loss must depend on the learning rate, the
weight decay and the batch size the way a real model's does (too high a rate diverges,
too low a rate stays near chance). Multinomial logistic regression on the 8x8 digits does
both in milliseconds per epoch. Tune trainables, Optuna objectives and worker scripts in
other processes import these functions, so every searcher trains the same model.

>>> import numpy as np
>>> from ddtk.data import load_dataset
>>> from ddtk.examples.softmax_tuning import sgd_epoch, heldout_loss, tuning_split
>>> ds = load_dataset("digits")
>>> data = tuning_split(ds.x.numpy(), ds.y.numpy())
>>> W, b, rng = np.zeros((64, 10)), np.zeros(10), np.random.default_rng(0)
>>> start = heldout_loss(W, b, data["xva"], data["yva"])
>>> for _ in range(3):
...     sgd_epoch(W, b, data["xtr"], data["ytr"], lr=0.5, wd=1e-4, batch=64, rng=rng)
>>> round(start, 3), heldout_loss(W, b, data["xva"], data["yva"]) < 0.5 * start
(2.303, True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["LOSS_CAP", "heldout_loss", "sgd_epoch", "softmax", "tuning_split"]

LOSS_CAP = 10.0
"""Validation losses are capped here, so that a diverged trial stays on a log-scale plot."""


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of logits ``z`` (shifted by the row maximum, so it never overflows)."""
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def sgd_epoch(
    W: np.ndarray,
    b: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    lr: float,
    wd: float,
    batch: int,
    rng: np.random.Generator,
) -> None:
    """One epoch of minibatch SGD on the cross-entropy, updating ``W`` and ``b`` in place.

    ``wd`` is L2 weight decay on ``W``; ``rng`` shuffles the samples, so a trial that seeds
    it reproduces its epochs exactly.
    """
    if batch < 1:
        raise ValueError(f"batch must be a positive number of samples, got {batch!r}")
    order = rng.permutation(len(y))
    for i in range(0, len(y), batch):
        j = order[i : i + batch]
        g = softmax(x[j] @ W + b)
        g[np.arange(len(j)), y[j]] -= 1.0
        g /= len(j)
        W -= lr * (x[j].T @ g + wd * W)
        b -= lr * g.sum(0)


def heldout_loss(W: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy on ``(x, y)``, capped at :data:`LOSS_CAP` (a diverged run's NaN too)."""
    p = softmax(x @ W + b)[np.arange(len(y)), y]
    loss = float(-np.log(np.maximum(p, 1e-12)).mean())
    return loss if loss < LOSS_CAP else LOSS_CAP


def tuning_split(images: np.ndarray, labels: np.ndarray, fraction: float = 0.8) -> dict:
    """Training images cut again into tuning-train and validation parts, flattened.

    Returns ``{"xtr", "ytr", "xva", "yva"}``: the first ``fraction`` of the samples trains,
    the rest validates. Search never sees the test split, which stays for the final model.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie strictly between 0 and 1, got {fraction!r}")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    cut = int(fraction * len(labels))
    if cut == 0 or cut == len(labels):
        raise ValueError(f"{len(labels)} samples are too few to split at {fraction}")
    flat = images.reshape(len(labels), -1)
    return {"xtr": flat[:cut], "ytr": labels[:cut], "xva": flat[cut:], "yva": labels[cut:]}
