"""The learner's side of a judged check: run notebook cells, answer probes with data only.

A judge (:mod:`~ddtk.course.judging.session`) starts this as a process of its own,
confined like a graded kernel, and never runs learner code itself. The worker reads
requests from its stdin and answers on its stdout; the learner's prints go to stderr.

- ``("exec", label, source)``: run a notebook cell (IPython syntax such as
  ``%matplotlib inline`` is translated, and magics do nothing) in the worker's one
  namespace;
- ``("probe", "module:function", kwargs)``: call an instructor probe,
  ``function(namespace, **kwargs)``, which calls the learner's functions and returns
  what they produced;
- ``("fork", folder)`` (a zygote, :class:`~ddtk.course.judging.session.WorkerPool`):
  fork a child that works in ``folder`` with a copy of the namespace and serves the
  requests that follow, while this process waits; when the child ends, this process
  answers ``("ended", exit code)`` and serves again. ``("exit",)`` ends a child.

Every answer is written with ``torch.save``, and the judge reads it with
``weights_only=True``: tensors, numbers, strings, lists, tuples and dicts only. So
whatever the learner's code does in here, what reaches the judge is data that it
checks itself, never code it runs or an object that claims to equal anything.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import struct
import sys
from typing import Any

_HEADER = struct.Struct("!Q")


class _Shell:
    """Just enough of ``get_ipython()`` for translated magics: each does nothing."""

    def run_line_magic(self, *_args: Any, **_kw: Any) -> None:
        return None

    def run_cell_magic(self, *_args: Any, **_kw: Any) -> None:
        return None

    def system(self, *_args: Any, **_kw: Any) -> None:
        return None

    getoutput = system


def read_message(stream: Any) -> Any:
    """One length-prefixed pickle from the judge (the judge is trusted), or None at the end."""
    import pickle

    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    return pickle.loads(stream.read(_HEADER.unpack(head)[0]))


def write_answer(stream: Any, status: str, value: Any) -> None:
    """One length-prefixed ``torch.save`` of ``{"status", "value"}`` to the judge."""
    import torch

    buf = io.BytesIO()
    torch.save({"status": status, "value": value}, buf)
    data = buf.getvalue()
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _translate(source: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _failure(exc: BaseException) -> tuple[str, str]:
    """``("stub", message)`` when an exercise is still the stub, else ``("error", text)``."""
    from ddtk.course.checks import not_implemented_in

    stub = not_implemented_in(exc)
    if stub is not None:
        return "stub", stub
    return "error", f"{type(exc).__name__}: {exc}"[:2000]


_PR_SET_CHILD_SUBREAPER = 36


def _adopt_orphans() -> None:
    """Become the parent of every orphaned descendant (Linux), so that they can be ended."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _end_descendants() -> None:
    """SIGKILL every process below this one (a child's rank jobs, daemons it started)."""
    import psutil

    procs = psutil.Process().children(recursive=True)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


def _fork(folder: str) -> int:
    """Fork a worker that works in ``folder`` (made by the child, as the jail's user), with
    its own temporary folder and the thread count a new interpreter would have. Returns
    the child's pid in the zygote and 0 in the child."""
    import tempfile

    pid = os.fork()
    if pid:
        return pid
    try:
        tmp = os.path.join(folder, "tmp")
        os.makedirs(tmp, exist_ok=True)
        os.chdir(folder)
        os.environ["TMPDIR"] = tempfile.tempdir = tmp
        _adopt_orphans()
        threads = os.environ.pop("DDTK_JUDGE_THREADS", "")
        if threads and "torch" in sys.modules:  # the zygote ran single-threaded (fork-safe OpenMP)
            sys.modules["torch"].set_num_threads(int(threads))
    except BaseException:  # a child that cannot set up must not serve: the zygote says it ended
        os._exit(70)
    return 0


def _serve(requests: Any, answers: Any, namespace: dict[str, Any]) -> None:
    while (message := read_message(requests)) is not None:
        op = message[0]
        try:
            if op == "fork":
                pid = _fork(message[1])
                if pid:  # the zygote: wait for the child, end what it left, say how it ended
                    _, status = os.waitpid(pid, 0)
                    _end_descendants()
                    write_answer(answers, "ended", os.waitstatus_to_exitcode(status))
                    continue
                value = None  # the child: answer, then serve the requests that follow
            elif op == "exit":
                _end_descendants()
                os._exit(0)
            elif op == "exec":
                _label, source = message[1], message[2]
                exec(compile(_translate(source), _label, "exec"), namespace)
                value = None
            elif op == "probe":
                module, _, name = message[1].partition(":")
                value = getattr(importlib.import_module(module), name)(namespace, **message[2])
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as exc:  # the learner's code may raise anything, SystemExit too
            status, text = _failure(exc)
            write_answer(answers, status, text)
            continue
        try:
            write_answer(answers, "ok", value)
        except Exception as exc:  # a value torch.save cannot write
            write_answer(answers, "error", f"the answer could not be sent: {exc}")


def value_of(namespace: dict[str, Any], name: str) -> Any:
    """A probe that returns one name of the namespace as it is (the judge reads it as data)."""
    return namespace[name]


def main() -> None:
    """Serve requests on the original stdin/stdout; the learner's output goes to stderr."""
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("MPLBACKEND", "Agg")
    if os.environ.pop("DDTK_JUDGE_ZYGOTE", "") == "1":  # a child's orphans come back here
        _adopt_orphans()
    from IPython.display import display

    namespace: dict[str, Any] = {"__name__": "__main__", "display": display,
                                 "get_ipython": lambda: _Shell()}  # fmt: skip
    _serve(requests, answers, namespace)


if __name__ == "__main__":
    main()
