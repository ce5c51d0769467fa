"""Show a recipe's source in a notebook, run it under its real launcher, and collect its JSON lines.

Lecture 03 displays the code a learner would write (``ddtk/examples/*.py``, or one
function of a job module) and then runs exactly that file with ``horovodrun`` or
``torchrun``; this module is the plumbing both steps need, so a cell stays one line:

>>> "model.join()" in source("ddp_features")
True
>>> json_lines(['[0]<stdout>:{"epoch": 1}', "noise", '[rank1]:{"rank": 1}'])
[{'epoch': 1}, {'rank': 1}]
"""

import inspect
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddtk.frameworks.launchers import horovodrun_command, run_command, torchrun_command

__all__ = ["json_lines", "run_cnn_horovod", "run_ddp_features", "show", "source"]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
_PREFIX = re.compile(r"^(\[\d+\]<std(?:out|err)>:|\[rank\d+\]:|\[default\d+\]:)\s*")


def source(what: str | Callable[..., Any]) -> str:
    """The source of ``ddtk/examples/<what>.py``, or of a function or module object."""
    if isinstance(what, str):
        return (EXAMPLES / f"{what}.py").read_text()
    return inspect.getsource(what)


def show(what: str | Callable[..., Any]) -> Any:
    """:func:`source` as syntax-highlighted code for a notebook (``IPython.display.Code``)."""
    from IPython.display import Code

    return Code(source(what), language="python")


def json_lines(lines: Sequence[str]) -> list[dict]:
    """The JSON objects among a job's output lines, launcher prefixes (``[0]<stdout>:``) removed."""
    rows = []
    for line in lines:
        text = _PREFIX.sub("", line.strip())
        if text.startswith("{") and text.endswith("}"):
            try:
                rows.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    return rows


def run_ddp_features(
    world_size: int = 2, timeout: float = 120.0, args: Sequence[str] = ()
) -> list[dict]:
    """``torchrun --nproc-per-node N -m ddtk.examples.ddp_features``: one report per rank."""
    cmd = torchrun_command(world_size, ["-m", "ddtk.examples.ddp_features", *args])
    rows = json_lines(
        run_command(cmd, timeout=timeout, echo=False, env={"OMP_NUM_THREADS": "1"}).lines
    )
    return sorted(rows, key=lambda r: r["rank"])


def run_cnn_horovod(
    world_size: int = 2, epochs: int = 1, hosts: str | None = None, timeout: float = 120.0
) -> list[dict]:
    """``horovodrun --gloo -np N -H hosts python -m ddtk.examples.cnn_horovod``: rank 0's epoch lines."""
    cmd = horovodrun_command(
        world_size, ["-m", "ddtk.examples.cnn_horovod", "--epochs", str(epochs)], hosts=hosts
    )
    return json_lines(
        run_command(cmd, timeout=timeout, echo=False, env={"OMP_NUM_THREADS": "1"}).lines
    )
