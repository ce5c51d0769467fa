"""The data of lab 01's job: scikit-learn's digits as numpy arrays and as Ray Datasets.

This module imports numpy and nothing heavier at the top, on purpose. Ray Data
pickles a ``map_batches`` function by reference, so every Ray worker process that
runs :func:`scale_pixels` imports the module that defines it. Defined beside the
training code, which imports torch and Ray Train, that import cost about 5 s of
CPU per fresh worker on a 2-core laptop, and each fit's first pipeline execution
waited for it (20-27 s for 1,437 rows in lab 01). Here a worker imports numpy only.

>>> parts = digits_split(val_fraction=0.2, seed=0)
>>> parts["train"][0].shape, parts["val"][0].shape
((1438, 1, 8, 8), (359, 1, 8, 8))
>>> batch = scale_pixels({"image": parts["val"][0][:2], "label": parts["val"][1][:2]})
>>> float(batch["image"].min()) >= -1.0, float(batch["image"].max()) <= 1.0, batch["image"].dtype
(True, True, dtype('float32'))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import ray.data

__all__ = ["digits_datasets", "digits_split", "scale_pixels"]


def scale_pixels(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The preprocessing step of the pipeline: digits pixels from [0, 16] to [-1, 1], as float32.

    Ray Data calls it on batches of rows (a dict of column arrays) in its own tasks;
    :func:`ddtk.examples.ray_digits.evaluate_checkpoint` calls it directly on numpy arrays.
    """
    image = batch["image"].astype(np.float32)
    return {"image": image / 8.0 - 1.0, "label": batch["label"].astype(np.int64)}


def digits_split(
    val_fraction: float = 0.2, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Digits as ``{"train": (images, labels), "val": (...)}``: images (N, 1, 8, 8), pixels 0..16.

    The split is seeded, so every run, every worker count and the plain-DDP
    comparison of lab 01 see the same samples.
    """
    from ddtk.sklearn_tables import sklearn_table

    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    pixels, labels = sklearn_table("digits")  # sklearn's file, without sklearn's 2 s import
    images = pixels.astype(np.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_val = round(len(labels) * val_fraction)
    parts = {"val": order[:n_val], "train": order[n_val:]}
    return {name: (images[idx], labels[idx]) for name, idx in parts.items()}


def digits_datasets(
    val_fraction: float = 0.2, seed: int = 0, blocks: int = 8
) -> tuple[ray.data.Dataset, ray.data.Dataset]:
    """The ``train`` and ``val`` Ray Datasets of :func:`digits_split`, with :func:`scale_pixels` applied.

    Columns ``image`` (float32, 1x8x8, in [-1, 1]) and ``label`` (int64). The
    ``map_batches`` step is lazy: it runs when the datasets are first read, or once
    at ``materialize()``, which :func:`ddtk.examples.ray_digits.fit` calls.
    ``blocks`` is how many pieces each dataset is cut into: one Ray task per block
    and step, so a few hundred rows in hundreds of blocks (``from_items``' default
    here) cost far more in scheduling than in work.
    """
    import ray.data

    datasets = {
        name: ray.data.from_items(
            [{"image": x, "label": y} for x, y in zip(images, labels)],
            override_num_blocks=blocks,
        ).map_batches(scale_pixels, batch_format="numpy")
        for name, (images, labels) in digits_split(val_fraction, seed).items()
    }
    return datasets["train"], datasets["val"]
