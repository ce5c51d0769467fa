"""The judged exercises of each lab (see :mod:`ddtk.course.judging`), by the lab's notebook name.

One module per lab: its probes (run next to the learner's answer) and its checks (run
by the judge). Importing any of this from an answer cell earns nothing: every exercise
forbids ``ddtk.course``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddtk.course.judging import LabJudge


def judge_for(lab: str) -> LabJudge | None:
    """The judge of the notebook ``lab`` (its stem, e.g. ``lab03-fault-tolerant``): the
    ``JUDGE`` of the module named by the stem's first word (``lab03``; ``lecture02``
    for the lecture ``02-ray``), or None when there is no such module."""
    word = lab.split("-")[0]
    name = f"{__name__}.{'lecture' + word if word.isdigit() else word}"
    if not lab or importlib.util.find_spec(name) is None:
        return None
    judge = importlib.import_module(name).JUDGE
    if judge.lab != lab:
        raise ValueError(f"{name} judges {judge.lab!r}, not {lab!r}")
    return judge


__all__ = ["judge_for"]
