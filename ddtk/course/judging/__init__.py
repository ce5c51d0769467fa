"""Judged exercises: the verdict comes from a process the learner's code never ran in.

A learner controls every line of a notebook kernel, so a check that runs there and
reports its own outcome can be talked into anything. A judged exercise splits the
check in two:

- **probes** (instructor functions, in :mod:`ddtk.course.judges`), which run in a
  :class:`~ddtk.course.judging.session.Worker` next to the learner's answer and call it
  on inputs the judge chose (seeded with a secret, so never the ones in the notebook);
  what they return is data;
- the **check** (``Exercise.check``), which runs in the judge's own process, computes
  what the answer should have produced with its own trusted code, and compares. When an
  answer must show it really did something (resumed instead of recomputing, wrote a
  temporary file, fsynced and renamed), the judge plants what only a working answer
  can carry forward, or observes it from outside (``strace``).

The worker is built from the solution's set-up cells (instructor code) and the
learner's answer cells for the exercise, nothing else the learner wrote; those cells
are first audited (:mod:`~ddtk.course.judging.audit`): an answer that imports what the
exercise asks to build (``Exercise.forbid``) earns nothing for that exercise.

A lab's notebook check cells call the same checks on the kernel's own namespace
(:func:`check_here`), so the learner sees the grader's verdict while working.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtk.course.checks import CheckFailed
from ddtk.course.grading.score import ExerciseResult
from ddtk.course.judging.audit import audit
from ddtk.course.judging.session import LearnerError, LocalWorker, StillStub, Worker, WorkerPool

if TYPE_CHECKING:
    from nbformat import NotebookNode


@dataclass
class Context:
    """What a check gets: fresh workers with the answer loaded, the secret seed, and
    ``ref``: the lab's own set-up (instructor code only) run in the judge's process, for
    computing what a correct answer produces."""

    make_worker: Callable[..., Any]
    seed: int
    ref: Mapping[str, Any]
    local: bool = False
    workers: list[Any] = field(default_factory=list)

    def worker(self, *, trace: bool = False) -> Any:
        """A fresh worker (a new process when grading) holding the set-up and the answer;
        ``trace``: its file system calls are recorded (``worker.trace_log``) by strace."""
        w = self.make_worker(trace=trace)
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            w.close()


@dataclass(frozen=True)
class Exercise:
    """One judged exercise: its answer cells (by id), what it must not import, its check."""

    number: int
    title: str
    cells: tuple[str, ...]
    check: Callable[[Context], None]
    forbid: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabJudge:
    """A lab's judged exercises and how to set a worker up from the solution's cells:
    ``setup`` lists ``(cell id, "imports" or "all")``: only a cell's imports (a set-up
    cell that also starts a cluster), or the whole cell (definitions)."""

    lab: str
    setup: tuple[tuple[str, str], ...]
    exercises: Mapping[int, Exercise]


def imports_only(source: str, skip: tuple[str, ...] = ("ray",)) -> str:
    """The top-level import statements of a cell (and ``try`` blocks of imports), without
    the modules in ``skip``: the names a set-up cell gives, without what it starts."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))

    def wanted(node: ast.stmt) -> bool:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            return not any(n == m or n.startswith(m + ".") for n in names for m in skip)
        return isinstance(node, ast.Try) and all(
            isinstance(b, ast.Import | ast.ImportFrom) for b in node.body
        )

    return "\n".join(ast.unparse(node) for node in tree.body if wanted(node))


def setup_cells(judge: LabJudge, nb: NotebookNode) -> list[tuple[str, str]]:
    """``(label, source)`` of the set-up a worker (and the reference) runs, from ``nb``."""
    found = {c.get("id"): c.get("source", "") for c in nb.cells if c.get("cell_type") == "code"}
    cells = []
    for cell_id, how in judge.setup:
        if cell_id not in found:
            raise ValueError(f"{judge.lab}: the notebook has no set-up cell {cell_id}")
        source = imports_only(found[cell_id]) if how == "imports" else found[cell_id]
        cells.append((f"setup-{cell_id}", source))
    return cells


def reference_namespace(cells: list[tuple[str, str]]) -> dict[str, Any]:
    """The set-up ``cells`` run in this (the judge's) process: instructor code only."""
    from IPython.core.inputtransformer2 import TransformerManager

    namespace: dict[str, Any] = {"__name__": "__judge__"}
    for label, source in cells:
        exec(compile(TransformerManager().transform_cell(source), label, "exec"), namespace)
    return namespace


# A judged exercise's finding: ``pass``, ``fail`` or ``error`` and why; the same record
# as a check cell's outcome, so a row of the class mixes both freely.
Verdict = ExerciseResult


def _cell_sources(nb: NotebookNode, ids: tuple[str, ...]) -> dict[str, str]:
    found = {c.get("id"): c.get("source", "") for c in nb.cells if c.get("cell_type") == "code"}
    return {i: found[i] for i in ids if i in found}


def _verdict(exercise: Exercise, ctx: Context) -> Verdict:
    name = f"Exercise {exercise.number} ({exercise.title})"
    try:
        exercise.check(ctx)
    except StillStub as exc:
        return Verdict(exercise.number, exercise.title, "fail", f"{name} is not done yet: {exc}")
    except CheckFailed as exc:  # a check in parts passes on the share that passed
        return Verdict(exercise.number, exercise.title, "fail", f"{name}: {exc}", exc.credit)
    except LearnerError as exc:
        return Verdict(exercise.number, exercise.title, "fail", f"{name}: your code raised {exc}")
    finally:
        ctx.close()
    return Verdict(exercise.number, exercise.title, "pass")


def judge_notebook(
    judge: LabJudge,
    solution: NotebookNode,
    learner: NotebookNode,
    *,
    parameters: Mapping[str, Any] | None = None,
    hide: tuple[Path, ...] | list[Path] = (),
    timeout: float = 120.0,
    only: tuple[int, ...] | None = None,
    pool: WorkerPool | None = None,
) -> dict[int, Verdict]:
    """Judge every exercise of ``judge`` (or ``only`` those) in ``learner``'s notebook.

    Each worker is a new process (:class:`Worker`), unless ``pool`` is given: then a child
    forked from a zygote that ran the set-up (:class:`WorkerPool`; trusted answers only)."""
    base = setup_cells(judge, solution)
    injected = "\n".join(f"{k} = {v!r}" for k, v in (parameters or {}).items())
    if injected:
        base.insert(1, ("parameters", injected))
    ref = reference_namespace(base)
    verdicts = {}
    for number, exercise in sorted(judge.exercises.items()):
        if only is not None and number not in only:
            continue
        answers = _cell_sources(learner, exercise.cells)
        lost = [i for i in exercise.cells if i not in answers]
        if lost:
            verdicts[number] = Verdict(number, exercise.title, "fail",
                                       f"Exercise {number} ({exercise.title}): the cell that holds "
                                       "the answer is missing from the notebook")  # fmt: skip
            continue
        stub = next((m for src in answers.values() if (m := stub_text(src, number))), None)
        if stub is not None:  # no process needed to see it
            verdicts[number] = Verdict(number, exercise.title, "fail",
                                       f"Exercise {number} ({exercise.title}) is not done yet: "
                                       f"the cell still raises NotImplementedError({stub!r})")  # fmt: skip
            continue
        forbid = (*exercise.forbid, "ddtk.course")
        found = [p for src in answers.values() for p in audit(src, forbid, exercise.allow)]
        if found:
            verdicts[number] = Verdict(number, exercise.title, "fail",
                                       f"Exercise {number} ({exercise.title}) earns nothing: "
                                       + "; ".join(found))  # fmt: skip
            continue
        answer = [(f"answer-{i}", src) for i, src in answers.items()]

        def make(answer: list[tuple[str, str]] = answer, trace: bool = False) -> Any:
            if pool is not None:
                return pool.worker(base, answer, timeout=timeout, hide=hide, trace=trace)
            return Worker(base + answer, timeout=timeout, hide=hide, trace=trace)

        verdicts[number] = _verdict(exercise, Context(make, secrets.randbelow(2**31), ref))
    return verdicts


def stub_text(source: str, number: int) -> str | None:
    """The message of exercise ``number``'s generated stub when ``source`` still raises it."""
    import re

    match = re.search(rf"raise NotImplementedError\((['\"])(Exercise {number}\b.*?)\1\)", source)
    return match.group(2) if match else None


@contextmanager
def _local(namespace: Mapping[str, Any]) -> Iterator[Context]:
    ctx = Context(
        lambda trace=False: LocalWorker(namespace), secrets.randbelow(2**31), namespace, local=True
    )
    yield ctx


def check_here(judge: LabJudge, number: int, namespace: Mapping[str, Any]) -> None:
    """Run exercise ``number``'s check on this kernel's ``namespace``: print a pass line
    or raise :class:`~ddtk.course.checks.CheckFailed` with the judge's message.

    In a grading run (``ddtk course grade``'s sandbox marks its kernels' environment) the
    check is not run here: the grader judges every exercise again in processes of its own,
    and that verdict replaces whatever this kernel decides, so a run here would cost the
    lab's judged checks twice and decide nothing."""
    import os

    from ddtk.course.grading.sandbox import MARKER

    if os.environ.get(MARKER):
        print(f"Exercise {number}: the grader judges it in its own processes (a grading run)")
        return
    exercise = judge.exercises[number]
    with _local(namespace) as ctx:
        verdict = _verdict(exercise, ctx)
    if verdict.status != "pass":
        raise CheckFailed(verdict.message)
    print(f"Exercise {number}: the grader's check passed too (inputs this notebook never used)")


__all__ = [
    "Context", "Exercise", "LabJudge", "Verdict", "check_here", "imports_only", "judge_notebook",
    "reference_namespace", "setup_cells", "stub_text",
]  # fmt: skip
