"""Run the instructor tests of a code question against a learner's code, isolated.

Every submission runs in its own new process with a timeout. The processes come from
a small *fork server*: a ``python -I`` interpreter (no user site, no environment, no
current directory on the path) started by the grader, which never runs learner code
itself and forks one child per submission. A fork costs about a millisecond where a
new interpreter costs tens, which is what keeps grading a class fast. Each child:

- gets ``/dev/null`` for stdin, stdout and stderr (so printing, even to stderr, never
  changes a score) and an empty temporary working directory;
- installs an audit hook, which cannot be removed, refusing network access (socket
  creation, connect, bind, name lookups), starting processes and ``ctypes``;
- caps its address space (1 GiB), is killed at the question's ``timeout``;
- runs the learner's code, then the instructor tests, in one namespace. Values the
  learner's function returns may not be objects of a class the submission defined
  (such an object could claim ``__eq__`` to everything); that call raises TypeError.

The instructor tests are plain Python. Each top-level ``assert`` statement and each
top-level ``def test_*()`` function is one check; every other top-level statement
(imports, helpers, data) is set-up, run in order. The parent counts the checks from
the key, so the child can only say which checks passed, on a private pipe, in lines
tagged with a random token; assertion messages and test source never reach feedback.

The learner's code shares the child interpreter with the tests: this stops accidents
and casual tampering, not a determined attacker (use a container for that).

>>> from ddtk.quiz.model import Question
>>> from fractions import Fraction
>>> q = Question(id="sq", type="code", points=Fraction(1), prompt="", function="sq",
...              tests="assert sq(2) == 4\\nassert sq(-3) == 9\\n", timeout=10)
>>> run_code_question(q, "def sq(x):\\n    return x * abs(x)\\n")
CodeResult(passed=1, total=2, note='')
"""

from __future__ import annotations

import ast
import json
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ddtk.quiz.model import Question

MEMORY_LIMIT = 1 << 30  # bytes of address space for each child
OUTPUT_LIMIT = 1 << 20  # bytes of result lines read from a child


@dataclass
class CodeResult:
    """What the instructor tests found: ``passed`` of ``total`` checks, and a safe note."""

    passed: int
    total: int
    note: str = ""


_SERVER = r"""
import json, os, select, shutil, signal, sys, tempfile, time


def run_job(job, wfd):
    token = job.pop("token")
    out = os.fdopen(wfd, "w", buffering=1)

    def report(line):
        out.write(token + " " + line + "\n")
        out.flush()

    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (job["memory"], job["memory"]))
    except Exception:
        pass
    blocked = ("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
               "os.system", "os.kill", "os.killpg", "pty.", "webbrowser.", "ctypes.", "gc.get_")

    def guard(event, args):
        if event.startswith(blocked):
            raise PermissionError("blocked during grading: " + event)

    sys.addaudithook(guard)
    ns = {"__name__": "__submission__"}
    try:
        exec(compile(job["code"], "submission.py", "exec"), ns)
    except BaseException as exc:
        line = getattr(exc, "lineno", None)
        where = f" at line {line}" if isinstance(exc, SyntaxError) and line else ""
        report("load " + json.dumps(type(exc).__name__ + where))
    fn = ns.get(job["function"]) if job["function"] else None
    if job["function"] and not callable(fn):
        report("missing")
    elif fn is not None and not isinstance(fn, type):
        ns[job["function"]] = plain_results(fn)
    for index, (kind, src) in enumerate(job["parts"]):
        try:
            exec(compile(src, "tests.py", "exec"), ns)
            if kind == "test":
                ns[src.split("def ", 1)[1].split("(", 1)[0].strip()]()
            if kind in ("assert", "test"):
                report("pass %d" % index)
        except BaseException:
            if kind == "setup":
                report("setup")


def made_here(value, depth=0):
    if type(value).__module__ == "__submission__":
        return True
    if depth < 4 and isinstance(value, (tuple, list, set, frozenset)):
        return any(made_here(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return any(made_here(k, depth + 1) or made_here(v, depth + 1) for k, v in value.items())
    return False


def plain_results(fn):
    def checked(*args, **kwargs):
        result = fn(*args, **kwargs)
        if made_here(result):
            raise TypeError("return built-in values, not objects of a class defined here")
        return result

    return checked


def child(job, wfd, tmp):
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, wfd)
        os.closerange(wfd + 1, 65536)
        os.chdir(tmp)
        run_job(job, wfd)
    finally:
        os._exit(0)


def reap(pid, deadline):
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(0.002)


def serve():
    stdin, stdout = sys.stdin.buffer, sys.stdout
    while True:
        line = stdin.readline()
        if not line:
            return
        job = json.loads(line)
        r, w = os.pipe()
        tmp = tempfile.mkdtemp(prefix="ddtk-quiz-")
        deadline = time.monotonic() + job["timeout"]
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(job, w, tmp)
        os.close(w)
        chunks, size = [], 0
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                continue
            data = os.read(r, 65536)
            if not data:
                break
            if size < job["output_limit"]:
                chunks.append(data)
                size += len(data)
        timed_out = reap(pid, deadline)
        os.close(r)
        shutil.rmtree(tmp, ignore_errors=True)
        text = b"".join(chunks).decode("utf-8", "replace")
        stdout.write(json.dumps({"out": text, "timed_out": timed_out}) + "\n")
        stdout.flush()


serve()
"""


@dataclass(frozen=True)
class TestPlan:
    """Instructor tests split into ordered parts: ``(kind, source)`` with kind
    ``setup``, ``assert`` or ``test``; ``checks`` counts the graded parts."""

    parts: tuple[tuple[str, str], ...]

    @property
    def checks(self) -> int:
        """How many parts are graded checks."""
        return sum(1 for kind, _ in self.parts if kind != "setup")


def plan_tests(tests: str) -> TestPlan:
    """Split instructor test source into set-up statements and checks."""
    tree = ast.parse(tests)
    parts = []
    for node in tree.body:
        src = ast.get_source_segment(tests, node) or ast.unparse(node)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            parts.append(("test", ast.unparse(node)))
        elif isinstance(node, ast.Assert):
            parts.append(("assert", src))
        else:
            parts.append(("setup", ast.unparse(node) if "\n" in src else src))
    return TestPlan(tuple(parts))


class ForkServer:
    """A ``python -I`` process that forks one isolated child per submission.

    Use as a context manager; :meth:`run` may be called from one thread at a time.
    If the server dies it is restarted for the next run.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._cwd = tempfile.mkdtemp(prefix="ddtk-quiz-server-")

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=self._cwd,
                env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8"},
            )
        return self._proc

    def run(self, job: dict) -> tuple[str, bool]:
        """Run one job; return (the child's result lines, whether it timed out)."""
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(job).encode() + b"\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError:
            line = b""
        if not line:
            self.close()
            return "", False
        reply = json.loads(line)
        return reply["out"], bool(reply["timed_out"])

    def close(self) -> None:
        """Stop the server process (it exits when its stdin closes)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if os.path.isdir(self._cwd):
            os.rmdir(self._cwd)


def run_tests(
    code: str,
    tests: str,
    function: str | None = None,
    timeout: float = 10.0,
    server: ForkServer | None = None,
) -> CodeResult:
    """Run ``tests`` against ``code`` in a new isolated process; never raises for
    anything the learner's code does. Pass a :class:`ForkServer` to reuse one."""
    plan = plan_tests(tests)
    token = secrets.token_hex(16)
    job = {
        "token": token,
        "code": code,
        "parts": plan.parts,
        "function": function,
        "memory": MEMORY_LIMIT,
        "timeout": timeout,
        "output_limit": OUTPUT_LIMIT,
    }
    if server is None:
        with ForkServer() as own:
            out, timed_out = own.run(job)
    else:
        out, timed_out = server.run(job)
    return _result(out, timed_out, plan, token, function, timeout)


def _result(
    out: str, timed_out: bool, plan: TestPlan, token: str, function: str | None, timeout: float
) -> CodeResult:
    passed: set[int] = set()
    notes = []
    for line in out.splitlines():
        if not line.startswith(token + " "):
            continue
        what = line[len(token) + 1 :]
        if what.startswith("pass ") and what[5:].isdigit():
            index = int(what[5:])
            if 0 <= index < len(plan.parts) and plan.parts[index][0] != "setup":
                passed.add(index)
        elif what.startswith("load "):
            try:
                name = str(json.loads(what[5:]))
            except ValueError:
                name = "an error"
            notes.append(f"Your code raised {name} when it was loaded.")
        elif what == "missing" and function:
            notes.append(f"No function named `{function}` was defined.")
        elif what == "setup":
            notes.append("The checks could not be prepared; tell your instructor.")
    if timed_out:
        notes.append(f"Stopped after {timeout:g} s: look for an endless loop.")
    return CodeResult(len(passed), plan.checks, " ".join(dict.fromkeys(notes)))


def run_code_question(q: Question, code: str, server: ForkServer | None = None) -> CodeResult:
    """Run the key's tests of code question ``q`` against the learner's ``code``."""
    if not q.tests:
        raise ValueError(f"question {q.id!r} has no instructor tests (is this a public file?)")
    return run_tests(code, q.tests, q.function, q.timeout, server)


def default_workers() -> int:
    """Parallel code runs by default: the CPU count, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


def run_many(jobs: list[tuple[Question, str]], workers: int | None = None) -> list[CodeResult]:
    """Run many (question, code) jobs on ``workers`` fork servers; results in job order."""
    if not jobs:
        return []
    workers = max(1, min(workers or default_workers(), len(jobs)))
    servers: queue.Queue[ForkServer] = queue.Queue()
    made: list[ForkServer] = []
    lock = threading.Lock()

    def one(job: tuple[Question, str]) -> CodeResult:
        try:
            server = servers.get_nowait()
        except queue.Empty:
            server = ForkServer()
            with lock:
                made.append(server)
        try:
            return run_code_question(job[0], job[1], server)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, jobs))
    finally:
        for server in made:
            server.__exit__()


def check_solutions(questions: tuple[Question, ...] | list[Question]) -> dict[str, CodeResult]:
    """Run every code question's reference solution against its tests (build-time check)."""
    code = [q for q in questions if q.type == "code" and q.solution and q.tests]
    results = run_many([(q, q.solution or "") for q in code])
    return {q.id: r for q, r in zip(code, results)}
