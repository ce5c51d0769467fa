"""The recipes of :mod:`ddtk.examples`, diffed against their single-process baselines.

"Lines changed from single-process code" in lecture 03's comparison is measured,
not estimated: :func:`lines_changed` diffs ``ddtk/examples/cnn_<name>.py`` against
``cnn_single.py`` (``cnn_keras.py`` for TensorFlow), ignoring docstrings,
blank lines and comments, and counts the lines added plus the lines removed.

>>> lines_changed("single")
0
>>> LAUNCHER_NAMES["horovod"]
'horovodrun'
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RECIPES = {
    "single": ("cnn_single", "cnn_single"),
    "ddp": ("cnn_ddp", "cnn_single"),
    "horovod": ("cnn_horovod", "cnn_single"),
    "deepspeed": ("cnn_deepspeed", "cnn_single"),
    "ddtk-dp": ("cnn_ddtk", "cnn_single"),
    "tf-mwms": ("cnn_tf", "cnn_keras"),
}
LAUNCHERS = {
    "single": "python -m ddtk.examples.cnn_single",
    "ddp": "torchrun --nproc-per-node N -m ddtk.examples.cnn_ddp",
    "horovod": "horovodrun -np N -H host:slots python -m ddtk.examples.cnn_horovod",
    "deepspeed": "deepspeed --num_gpus N --module ddtk.examples.cnn_deepspeed (or torchrun)",
    "ddtk-dp": "torchrun --nproc-per-node N -m ddtk.examples.cnn_ddtk",
    "tf-mwms": "one process per worker, TF_CONFIG (python -m ddtk.examples.cnn_tf)",
}
LAUNCHER_NAMES = {
    "single": "python",
    "ddp": "torchrun",
    "horovod": "horovodrun",
    "deepspeed": "deepspeed/torchrun",
    "ddtk-dp": "torchrun",
    "tf-mwms": "TF_CONFIG/process",
}


def _docstring_lines(tree: ast.Module) -> set[int]:
    """Line numbers (1-based) of the module's, classes' and functions' docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(module: str) -> list[str]:
    """The module's source without docstrings, blank lines and comment-only lines."""
    source = (EXAMPLES / f"{module}.py").read_text()
    skip = _docstring_lines(ast.parse(source))
    return [
        ln.rstrip()
        for n, ln in enumerate(source.splitlines(), start=1)
        if n not in skip and ln.strip() and not ln.strip().startswith("#")
    ]


def _recipe(name: str) -> tuple[str, str]:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    return RECIPES[name]


def unified_diff(name: str) -> str:
    """The recipe's code against its baseline's, as a unified diff (docstrings left out)."""
    module, base = _recipe(name)
    return "\n".join(
        difflib.unified_diff(code_lines(base), code_lines(module), f"{base}.py", f"{module}.py", lineterm="")
    )


def lines_changed(name: str) -> int:
    """Lines added plus lines removed to turn the baseline into the recipe ``name``."""
    module, base = _recipe(name)
    diff = difflib.ndiff(code_lines(base), code_lines(module))
    return sum(1 for line in diff if line[:2] in ("+ ", "- "))
