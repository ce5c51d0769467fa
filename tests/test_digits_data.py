"""Lab 01's data module: the split, the preprocessing step, and what a Ray worker must import.

Ray Data pickles ``scale_pixels`` by reference, so each fresh Ray worker that runs
it imports ``ddtk.examples.digits_data``. That import must stay light: a torch or
Ray Train import there costs seconds of CPU per worker and stalls the first epoch.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ddtk.examples.digits_data import digits_split, scale_pixels


def test_worker_import_loads_neither_torch_nor_ray_train() -> None:
    probe = (
        "import sys, ddtk.examples.digits_data as m; "
        "print(sorted(n for n in ('torch', 'ray.train', 'ray.data', 'sklearn') if n in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_scale_pixels_maps_0_16_to_minus1_1() -> None:
    batch = {"image": np.array([0.0, 8.0, 16.0]), "label": np.array([1, 2, 3], dtype=np.int32)}
    out = scale_pixels(batch)
    np.testing.assert_array_equal(out["image"], np.array([-1.0, 0.0, 1.0], dtype=np.float32))
    assert out["image"].dtype == np.float32 and out["label"].dtype == np.int64


def test_split_is_seeded_disjoint_and_complete() -> None:
    a, b, other = digits_split(0.2, seed=0), digits_split(0.2, seed=0), digits_split(0.2, seed=1)
    for name in ("train", "val"):
        np.testing.assert_array_equal(a[name][1], b[name][1])
    assert not np.array_equal(a["val"][1], other["val"][1])
    n_train, n_val = len(a["train"][1]), len(a["val"][1])
    assert (n_train, n_val) == (1438, 359)
    # together the two parts are exactly the data set: same rows, each once
    from sklearn.datasets import load_digits

    full = load_digits()
    rows = np.concatenate([a["train"][0], a["val"][0]]).reshape(n_train + n_val, 64)
    labels = np.concatenate([a["train"][1], a["val"][1]])
    got = sorted(map(tuple, np.column_stack([rows, labels]).tolist()))
    want = sorted(map(tuple, np.column_stack([full.images.reshape(-1, 64), full.target]).tolist()))
    assert got == want


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_split_refuses_a_fraction_outside_0_1(fraction: float) -> None:
    with pytest.raises(ValueError, match="val_fraction must be between 0 and 1"):
        digits_split(fraction)
