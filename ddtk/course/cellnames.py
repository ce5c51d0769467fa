"""Which names a notebook cell reads and binds, and whether running it only defines things.

A lab's check can be tried on one function alone when every name it reads comes from
cells that are cheap to run again: the set-up cells, the exercise cells, and cells that
only define things (imports, functions, classes, constants). This module reads that
from the cells' source with :mod:`ast`; nothing runs. IPython's magics (``%matplotlib``)
and shell escapes (``!ls``) are blanked before parsing.

>>> sorted(reads("total = helper(x) + len(y)\\nz = total"))
['helper', 'x', 'y']
>>> sorted(binds("import numpy as np\\ndef f(a):\\n    return a\\nK, L = 1, 2"))
['K', 'L', 'f', 'np']
>>> only_defines("import os\\nSIZE = 4\\ndef f():\\n    return os.getpid()")
True
>>> only_defines("result = train(steps=100)")
False
"""

from __future__ import annotations

import ast
import builtins

# Names every IPython kernel provides without an import.
_KERNEL_NAMES = frozenset({"display", "get_ipython", "In", "Out", "exit", "quit"})
_BUILTINS = frozenset(dir(builtins)) | _KERNEL_NAMES
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def parse(source: str) -> ast.Module | None:
    """The cell's syntax tree with magics blanked, or None when it is not Python."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _bound_by(node: ast.AST) -> set[str]:
    """Names a statement or expression binds in the scope it runs in."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return {node.id}
    if isinstance(node, ast.ExceptHandler) and node.name:
        return {node.name}
    if isinstance(node, ast.arg):
        return {node.arg}
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return set(node.names)
    return set()


def binds(source: str) -> set[str]:
    """The names running the cell binds at the top level (not inside functions or classes)."""
    tree = parse(source)
    if tree is None:
        return set()
    found: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        found |= _bound_by(node)
        if isinstance(node, (*_SCOPES, *_COMPREHENSIONS)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def reads(source: str) -> set[str]:
    """Names the cell reads, anywhere in it, that it does not bind itself and Python or
    the kernel does not provide: what must already exist when it runs.

    Conservative: a name bound anywhere in the cell (a function's argument, say) counts
    as the cell's own everywhere in it.
    """
    tree = parse(source)
    if tree is None:
        return set()
    loaded: set[str] = set()
    bound: set[str] = set()
    # ``total += x`` reads ``total`` before it binds it
    augmented = {id(n.target) for n in ast.walk(tree) if isinstance(n, ast.AugAssign)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and (isinstance(node.ctx, ast.Load) or id(node) in augmented):
            loaded.add(node.id)
        elif id(node) not in augmented:
            bound |= _bound_by(node)
    return loaded - bound - _BUILTINS


def _static(value: ast.AST) -> bool:
    """True for an expression that computes nothing: literals, names and attribute reads."""
    if isinstance(value, (ast.Constant, ast.Name, ast.Attribute)):
        return True
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return all(_static(v) for v in value.elts)
    if isinstance(value, ast.Dict):
        return all(k is None or _static(k) for k in value.keys) and all(
            _static(v) for v in value.values
        )
    if isinstance(value, ast.UnaryOp):
        return _static(value.operand)
    if isinstance(value, ast.BinOp):
        return _static(value.left) and _static(value.right)
    if isinstance(value, ast.JoinedStr):
        return all(
            _static(v.value) if isinstance(v, ast.FormattedValue) else True for v in value.values
        )
    return False


def only_defines(source: str) -> bool:
    """True when running the cell only imports and defines: nothing is computed or started."""
    tree = parse(source)
    if tree is None:
        return False
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef, ast.Pass)):  # fmt: skip
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring or a bare constant
        assigns = isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None
        if assigns and _static(stmt.value):
            continue
        return False
    return True


__all__ = ["binds", "only_defines", "parse", "reads"]
