"""The judged exercises of each lab (see :mod:`ddtk.course.judging`), by the lab's notebook name.

One module per lab: its probes (run next to the learner's answer) and its checks (run
by the judge). Importing any of this from an answer cell earns nothing: every exercise
forbids ``ddtk.course``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddtk.course.judging import LabJudge

_MODULES = {"lab03-fault-tolerant": "ddtk.course.judges.lab03"}


def judge_for(lab: str) -> LabJudge | None:
    """The judge of the lab notebook ``lab`` (its stem), or None when it has none yet."""
    module = _MODULES.get(lab)
    return None if module is None else importlib.import_module(module).JUDGE


__all__ = ["judge_for"]
