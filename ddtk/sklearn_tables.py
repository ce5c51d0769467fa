"""The real datasets that ship inside scikit-learn, read from their files without importing it.

``import sklearn.datasets`` pulls in SciPy and costs about 2 s of CPU; every rank of
every job that trains on digits paid it, and on 2 cores that was most of a small
job's start-up. The files are the ones scikit-learn's own loaders read, so the arrays
are the same (``tests/test_data.py`` compares them). This module imports numpy only,
so that Ray Data workers that import :mod:`ddtk.examples.digits_data` stay light.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

__all__ = ["SKLEARN_FILES", "sklearn_table"]

SKLEARN_FILES = {
    "digits": "digits.csv.gz",
    "iris": "iris.csv",
    "wine": "wine_data.csv",
    "breast_cancer": "breast_cancer.csv",
}
"""The file under ``sklearn/datasets/data/`` that holds each real dataset."""


def sklearn_table(name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(features, targets)`` of a table that ships with scikit-learn, read from its file.

    The same arrays as ``sklearn.datasets.load_<name>()``'s ``data`` and ``target``
    (float64 and int64). Every row is one sample, its class last; the plain CSVs start
    with a header row (sample and feature counts, class names), ``digits.csv.gz`` has
    none. If a scikit-learn release moves a file, this falls back to scikit-learn's own
    loader.
    """
    if name not in SKLEARN_FILES:
        raise ValueError(
            f"{name!r} is not a scikit-learn table; choose one of {', '.join(SKLEARN_FILES)}"
        )
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the {name} dataset ships with scikit-learn, which is not installed")
    path = Path(spec.submodule_search_locations[0], "datasets", "data", SKLEARN_FILES[name])
    if not path.is_file():
        import sklearn.datasets

        bunch = getattr(sklearn.datasets, f"load_{name}")()
        return bunch.data, bunch.target.astype(np.int64)
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",")
    else:
        table = np.loadtxt(path, delimiter=",", skiprows=1)
    return table[:, :-1], table[:, -1].astype(np.int64)
