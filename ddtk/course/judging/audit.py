"""Audit an answer cell: no import of what the exercise asks to build, no dynamic code.

An exercise that a ddtk (or library) import can do whole teaches nothing when answered
that way, so each exercise names what its answer must not import (``forbid``: module
prefixes such as ``ddtk.checkpoint``), and the names the lab itself hands out from
them (``allow``: ``ddtk.checkpoint.atomic.fsync_dir``). The audit reads the cell's
syntax tree (IPython syntax translated first), so nothing runs. Dynamic imports and
dynamic code (``importlib``, ``__import__``, ``exec``, ``eval``, ``compile``) are
refused outright in an answer: they are how a forbidden import would hide.

>>> audit("from ddtk.checkpoint.atomic import atomic_save", ("ddtk.checkpoint",), ())
['imports ddtk.checkpoint.atomic.atomic_save, which does what this exercise asks you to write']
>>> audit("from ddtk.checkpoint.atomic import fsync_dir", ("ddtk.checkpoint",), ("ddtk.checkpoint.atomic.fsync_dir",))
[]
>>> audit("m = __import__('ddtk')", (), ())
['uses __import__ (dynamic imports and code are not allowed in an answer)']
"""

from __future__ import annotations

import ast

DYNAMIC = frozenset({"importlib", "__import__", "exec", "eval", "compile", "builtins",
                     "__builtins__", "runpy", "imp", "inspect", "gc", "ctypes", "globals",
                     "vars", "locals", "__main__"})  # fmt: skip
# Attributes that reach into frames, code and namespaces: how an answer would read the
# judge's inputs or rewrite another module instead of computing its result.
INTROSPECTION = frozenset({"_getframe", "f_back", "f_locals", "f_globals", "f_code", "gi_frame",
                           "tb_frame", "__globals__", "__code__", "__closure__", "__dict__",
                           "__builtins__", "__subclasses__", "__bases__", "__mro__"})  # fmt: skip


def _forbidden(name: str, forbid: tuple[str, ...], allow: tuple[str, ...]) -> bool:
    if name in allow:
        return False
    return any(name == f or name.startswith(f + ".") for f in forbid)


def _imported(node: ast.AST) -> list[str]:
    """The dotted names an import statement brings in (``from a import b`` -> ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [f"{node.module}.{a.name}" for a in node.names]
    return []


def audit(source: str, forbid: tuple[str, ...], allow: tuple[str, ...]) -> list[str]:
    """What is wrong with the answer ``source``, one sentence each; empty when nothing."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError as exc:
        return [f"the cell is not valid Python (line {exc.lineno}: {exc.msg})"]
    found: list[str] = []
    for node in ast.walk(tree):
        for name in _imported(node):
            module = name.split(".")[0]
            if module in DYNAMIC:
                found.append(
                    f"imports {module} (dynamic imports and code are not allowed in an answer)"
                )
            elif _forbidden(name, forbid, allow):
                found.append(f"imports {name}, which does what this exercise asks you to write")
        if isinstance(node, ast.Name) and node.id in DYNAMIC:
            found.append(f"uses {node.id} (dynamic imports and code are not allowed in an answer)")
        if isinstance(node, ast.Attribute) and node.attr in INTROSPECTION:
            found.append(
                f"uses .{node.attr} (reaching into frames and namespaces is not allowed in an answer)"
            )
        if isinstance(node, ast.Attribute) and node.attr in ("__import__", "import_module"):
            found.append(
                f"uses {node.attr} (dynamic imports and code are not allowed in an answer)"
            )
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "modules"
            and getattr(node.value, "id", "") == "sys"
        ):
            found.append("uses sys.modules (replacing modules is not allowed in an answer)")
    return list(dict.fromkeys(found))


__all__ = ["DYNAMIC", "INTROSPECTION", "audit"]
