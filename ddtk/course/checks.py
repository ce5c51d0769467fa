"""What a lab's check cells use: a failure that teaches, and exercises that are not done yet.

A check cell tests the behaviour of what the learner wrote. When it fails it raises
:class:`CheckFailed` (an ``AssertionError``) with a message that says what was
expected and what came back. An unfinished exercise raises ``NotImplementedError``
(the stub ``ddtk course build`` writes), possibly deep inside Ray or a rank process;
:func:`exercise` turns that into "Exercise 3 (training loop) is not done yet" instead
of a page of someone else's traceback. Where the check would first start something
slow (a Ray Train job, ranks), ``exercise(..., uses=(fn,))`` looks at the functions
it is about to run and says so at once when one is still the stub.

>>> with exercise(1, "ring sum"):
...     expect(sum([1, 2, 3]) == 6, "the sum of 1, 2, 3", expected=6, got=sum([1, 2, 3]))
Exercise 1 passed: ring sum
>>> def stub():
...     raise NotImplementedError("Exercise 1: ring sum")
>>> with exercise(1, "ring sum"):
...     stub()
Traceback (most recent call last):
...
ddtk.course.checks.CheckFailed: Exercise 1 (ring sum) is not done yet: ...
>>> with exercise(1, "ring sum", uses=(stub,)):
...     print("never reached: a cluster job would start here")
Traceback (most recent call last):
...
ddtk.course.checks.CheckFailed: Exercise 1 (ring sum) is not done yet: stub() still ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

__all__ = [
    "CheckFailed", "Parts", "exercise", "expect", "keep_yours", "not_implemented_in", "stub_message",
]  # fmt: skip

_STUB_PREFIX = "Exercise "  # how every message of a generated stub starts (ddtk course build)


class CheckFailed(AssertionError):
    """A check found that an exercise does not do what it should; the message says why.

    ``credit`` is the share of the exercise's points the answer still earns (0 to 1,
    below 1): a check in parts (:class:`Parts`) passes it on. The grader honours it only
    from a judge's own process, never from a learner's kernel.
    """

    def __init__(self, message: str = "", *, credit: Fraction | int = 0) -> None:
        super().__init__(message)
        credit = Fraction(credit)
        if not 0 <= credit < 1:
            raise ValueError(f"credit is a share from 0 up to (not including) 1, got {credit}")
        self.credit = credit


class Parts:
    """A check in named parts, for partial credit: every part runs, each failure is noted,
    and :meth:`finish` raises one :class:`CheckFailed` whose ``credit`` is the share of
    parts that passed.

    >>> parts = Parts()
    >>> with parts.part("sums"):
    ...     expect(1 + 1 == 2, "1 + 1", expected=2, got=2)
    >>> with parts.part("products"):
    ...     expect(2 * 2 == 5, "2 * 2", expected=5, got=4)
    >>> parts.finish()
    Traceback (most recent call last):
    ...
    ddtk.course.checks.CheckFailed: 1 of 2 parts passed (sums); products: 2 * 2: expected 5, got 4
    >>> parts.credit
    Fraction(1, 2)
    """

    def __init__(self) -> None:
        self.passed: list[str] = []
        self.failed: list[tuple[str, str]] = []

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Run one part; a :class:`CheckFailed` inside it is noted, not raised."""
        try:
            yield
        except CheckFailed as exc:
            self.failed.append((name, str(exc)))
        else:
            self.passed.append(name)

    @property
    def credit(self) -> Fraction:
        """The share of parts that passed."""
        total = len(self.passed) + len(self.failed)
        return Fraction(len(self.passed), total) if total else Fraction(0)

    def finish(self) -> None:
        """Raise :class:`CheckFailed` naming the failed parts, unless every part passed."""
        if not self.failed:
            return
        total = len(self.passed) + len(self.failed)
        kept = f" ({', '.join(self.passed)})" if self.passed else ""
        why = "; ".join(f"{name}: {text}" for name, text in self.failed)
        raise CheckFailed(f"{len(self.passed)} of {total} parts passed{kept}; {why}",
                          credit=self.credit)  # fmt: skip


def expect(condition: Any, what: str, *, expected: Any, got: Any) -> None:
    """Raise :class:`CheckFailed` naming ``what``, ``expected`` and ``got`` unless ``condition``."""
    if not condition:
        raise CheckFailed(f"{what}: expected {expected}, got {got}")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the per-worker errors Ray Train wraps, each once."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        failures = getattr(current, "worker_failures", None)  # ray.train WorkerGroupError
        if isinstance(failures, dict):
            stack += [e for e in failures.values() if isinstance(e, BaseException)]


def not_implemented_in(exc: BaseException) -> str | None:
    """The message of the ``NotImplementedError`` behind ``exc``, if there is one.

    Looks through chained exceptions, Ray Train's per-worker failures, and the text
    of errors that carry a remote traceback only as a string (Ray, ``ddtk.launch``).
    """
    for err in _causes(exc):
        if isinstance(err, NotImplementedError):
            return str(err) or "NotImplementedError"
        text = str(err)
        marker = "NotImplementedError: "
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    return None


def stub_message(fn: Callable[..., Any]) -> str | None:
    """The message of the generated ``raise NotImplementedError("Exercise N: ...")`` in
    ``fn``'s own body, or None when ``fn`` no longer has it.

    Reads the compiled code (names and constants), so nothing runs.
    """
    code = getattr(fn, "__code__", None)
    if code is None or "NotImplementedError" not in code.co_names:
        return None
    for const in code.co_consts:
        if isinstance(const, str) and const.startswith(_STUB_PREFIX):
            return const
    return None


def _not_done(name: str, detail: str) -> CheckFailed:
    return CheckFailed(
        f"{name} is not done yet: {detail}. Replace the `raise NotImplementedError(...)` line "
        "with your answer and rerun the exercise cell, then this check."
    )


@contextmanager
def exercise(
    number: int, title: str, *, uses: tuple[Callable[..., Any], ...] = ()
) -> Iterator[None]:
    """Run a check of exercise ``number``: print a pass line, or raise :class:`CheckFailed`.

    A ``NotImplementedError`` anywhere behind the failure means the exercise is still
    the stub; other errors are reported as raised by the learner's code, chained so
    the full traceback stays available. ``uses`` names the learner's functions the
    check runs: one that is still the stub fails the check before it starts anything.
    """
    name = f"Exercise {number} ({title})"
    for fn in uses:
        stub = stub_message(fn)
        if stub is not None:
            raise _not_done(name, f"{fn.__name__}() still raises NotImplementedError ({stub})")
    try:
        yield
    except CheckFailed as exc:
        raise CheckFailed(f"{name}: {exc}", credit=exc.credit) from None
    except Exception as exc:
        stub = not_implemented_in(exc)
        if stub is not None:
            raise _not_done(name, f"the code still raises NotImplementedError ({stub})") from None
        raise CheckFailed(f"{name}: your code raised {type(exc).__name__}: {exc}") from exc
    print(f"Exercise {number} passed: {title}")


class _Kept:
    """The learner's own functions, kept across a lecture's collapsed answer cell."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self._ns = namespace
        self._yours = {
            name: value
            for name, value in namespace.items()
            if callable(value)
            and not name.startswith("_")
            and stub_message(value) is None
            and not getattr(value, "__ddtk_answer__", False)
        }

    def restore(self) -> None:
        """Put back what the learner wrote; mark what the answer filled in, and say which."""
        kept, filled = [], []
        for name, value in list(self._ns.items()):
            if name.startswith("_") or not callable(value) or value is self._yours.get(name):
                continue
            if name in self._yours:
                self._ns[name] = self._yours[name]
                kept.append(name)
            elif getattr(value, "__module__", None) == self._ns.get("__name__"):
                try:
                    value.__ddtk_answer__ = True
                except (AttributeError, TypeError):
                    continue
                filled.append(name)
        if kept:
            print(f"kept yours: {', '.join(kept)} (the check below tests your code)")
        if filled:
            print(f"filled in from this answer: {', '.join(filled)}")


def keep_yours(namespace: dict[str, Any]) -> _Kept:
    """Remember the functions the learner wrote in ``namespace`` before a lecture's answer
    cell redefines them; ``.restore()`` at the cell's end puts them back.

    Only a stub (or nothing, or an earlier run of an answer) is replaced by the answer,
    so running every cell in order checks the learner's code where there is some.
    """
    return _Kept(namespace)
