"""``ddtk course grade`` against a hostile class: escapes, limits and sabotage of the results.

Each attack is a cell a student adds to the tiny lab of ``test_course_grade``. Whether it
worked is judged from outside the kernel: files on the grader's disk, processes still
alive, connections a server saw, what the output folder holds. What the kernel prints
about itself is never the evidence. Every attack must fail, and the students who did
nothing wrong must be graded as if the attackers were not in the class.

Needs the confinement of :mod:`ddtk.course.grading.jail` (bubblewrap and root, as in
CI); the one-line report of missing protections is tested with it switched off.
"""

from __future__ import annotations

import copy
import csv
import json
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from test_course_grade import index_of, solved, stub_of, tiny_solution, with_cell, write

from ddtk.course.cli import main
from ddtk.course.grading.jail import confinement
from ddtk.course.grading.sandbox import Limits, execute

pytestmark = pytest.mark.notebook

REPO = Path(__file__).resolve().parents[1]


def _confined() -> None:
    conf = confinement()
    if conf.missing:
        pytest.skip(conf.summary())


class _Listener:
    """A TCP server on the grader's loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.sock.close()


def _attacks(root: Path, token: str, victim: int, port: int) -> dict[str, str]:
    """Student name -> the cell that student adds after the set-up cell."""
    targets = [root / "subs" / "ghost.ipynb", root / "solutions" / "pwned", root / "out-pwned",
               REPO / "ddtk" / f"pwned-{token}", Path("/tmp") / f"pwned-{token}"]  # fmt: skip
    return {
        "writer": (
            f"for p in {[str(t) for t in targets]!r}:\n"
            "    try:\n        open(p, 'w').write('x')\n    except OSError as e:\n        print(p, e)\n"
            f"try:\n    open({str(REPO / 'ddtk' / '__init__.py')!r}, 'a').write('#')\n"
            "except OSError as e:\n    print(e)"
        ),
        "reader": (
            f"for p in [{str(root / 'subs' / 'sol.ipynb')!r}, {str(root / 'solutions' / 'lab99-tiny.ipynb')!r}]:\n"
            "    try:\n        print(open(p).read())\n    except OSError as e:\n        print(p, e)"
        ),
        "daemon": (
            "import os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execvp('sh', ['sh', '-c', 'sleep 4; echo x > /tmp/daemon-{token}', '{token}'])\n"
            "    os._exit(0)\n"
            "time.sleep(0.5)"
        ),
        "killer": (
            "import os, signal\n"
            f"for pid in ({victim}, 1, os.getppid()):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print(pid, e)"
        ),
        "net": (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "except OSError as e:\n    print(e)"
        ),
        "flood": "import sys\nfor _ in range(40):\n    sys.stdout.write('x' * (1 << 20))",
        "symlink": (
            "import os\n"
            f"os.symlink({str(root / 'private.txt')!r}, 'lab99-report.md')\n"
            f"os.symlink({str(root / 'subs' / 'sol.ipynb')!r}, 'lab99-report.json')"
        ),
    }


def _raise_limit_then_allocate(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The solution, with exercise 1 first raising its own memory limit, then using 3 GiB."""
    nb = nbformat.from_dict(json.loads(json.dumps(solution)))
    cell = nb.cells[index_of(nb, "ex1")]
    cell.source = (
        "import resource\n"
        "try:\n    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
        "except (ValueError, OSError) as e:\n    print('refused:', e)\n"
        + cell.source.replace(
            "return sum(values)", "blob = bytearray(3 << 30)\n    return sum(values)"
        )
    )
    return nb


def test_a_hostile_class_escapes_nothing_and_spoils_no_one_elses_grade(tmp_path: Path) -> None:
    _confined()
    token = secrets.token_hex(6)
    secret = f"classmate-secret-{token}"
    solution = tiny_solution()  # the secret: in an answer (not in the stub), a classmate's
    ex1 = solution.cells[index_of(solution, "ex1")]  # hand-in and a private file
    ex1.source = ex1.source.replace("# END SOLUTION", f"# {secret}\n    # END SOLUTION")
    sol_path = write(solution, tmp_path / "solutions" / "lab99-tiny.ipynb")
    (tmp_path / "private.txt").write_text(f"private {secret}\n")
    stub = stub_of(solution)
    subs = tmp_path / "subs"
    classmate = copy.deepcopy(solution)
    classmate.cells.append(nbformat.v4.new_markdown_cell(f"my notes {secret}"))
    write(classmate, subs / "sol.ipynb")
    write(solved(stub, solution, 1), subs / "=HYPERLINK(1).ipynb")
    victim = subprocess.Popen(["sleep", "600"])
    listener = _Listener()
    try:
        for name, cell in _attacks(tmp_path, token, victim.pid, listener.port).items():
            write(with_cell(stub, "setup", cell), subs / f"{name}.ipynb")
        write(_raise_limit_then_allocate(solution), subs / "rlimit.ipynb")
        out = tmp_path / "out"
        code = main(["grade", str(sol_path), str(subs), "--out", str(out), "--jobs", "2",
                     "--timeout", "60", "--memory-limit", "2048"])  # fmt: skip
        time.sleep(5)  # the daemon's sleep is over: had it survived, it would have written by now
        assert victim.poll() is None, "a kernel killed a process outside its jail"
        assert listener.accepted == 0, "a kernel reached the grader's loopback"
    finally:
        victim.kill()
        victim.wait()
        listener.close()
    assert code == 1
    report = json.loads((out / "results.json").read_text())
    rows = {r["student"]: r for r in report["students"]}
    # those who did nothing wrong are graded as usual
    assert rows["sol"]["status"] == "pass", rows["sol"]
    assert rows["=HYPERLINK(1)"]["score"] == 1
    # nothing was written outside the sandbox, and no process outlived its run
    for path in [subs / "ghost.ipynb", tmp_path / "solutions" / "pwned", tmp_path / "out-pwned",
                 REPO / "ddtk" / f"pwned-{token}", Path("/tmp") / f"pwned-{token}",
                 Path("/tmp") / f"daemon-{token}"]:  # fmt: skip
        assert not path.exists(), path
    assert not (REPO / "ddtk" / "__init__.py").read_text().endswith("#")
    assert [p for p in psutil.process_iter(["cmdline"]) if token in (p.info["cmdline"] or [])] == []
    # what a student could read: not a classmate's notebook, not the solution, not a private file
    for student in set(rows) - {"sol", "rlimit", "=HYPERLINK(1)"}:  # these hold the answer
        folder = out / student.replace("=", "_").replace("(", "_").replace(")", "_")
        for path in folder.glob("*"):
            assert secret not in path.read_text(errors="replace"), path
    assert not (out / "symlink" / "lab99-report.md").exists()
    assert not (out / "symlink" / "lab99-report.json").exists()
    # the memory limit is hard: raising it was refused, so 3 GiB failed
    assert "MemoryError" in rows["rlimit"]["exercises"][0]["message"], rows["rlimit"]
    # 40 MiB of output is stopped at the cap, for that student alone
    flood = rows["flood"]
    assert flood["status"] == "error" and "MiB of output" in flood["error"], flood
    assert (out / "flood" / "lab99-tiny.executed.ipynb").stat().st_size < 6 * 2**20
    # the output folder holds what the grader wrote, and the spreadsheet runs no formula
    with (out / "grades.csv").open() as f:
        grades = {r["student"]: r for r in csv.DictReader(f)}
    assert "'=HYPERLINK(1)" in grades
    assert not (out / "ghost").exists()


def test_the_output_folder_holds_only_what_the_grader_wrote(tmp_path: Path) -> None:
    solution = tiny_solution()
    sol_path = write(solution, tmp_path / "lab99-tiny.ipynb")
    subs = tmp_path / "subs"
    write(solution, subs / "ann.ipynb")
    out = tmp_path / "out"
    (out / "grades.csv").mkdir(parents=True)  # sabotage: a folder where a result goes
    assert main(["grade", str(sol_path), str(subs), "--out", str(out), "--timeout", "60"]) == 2
    assert (out / "grades.csv").is_dir()  # refused, and left alone
    out = tmp_path / "fresh"
    assert main(["grade", str(sol_path), str(subs), "--out", str(out), "--timeout", "60"]) == 0
    (out / "ghost").mkdir()
    (out / "ghost" / "results.json").write_text('{"score": 100}')
    (out / "results.json").unlink()
    (out / "results.json").mkdir()
    assert main(["grade", str(sol_path), str(subs), "--out", str(out), "--timeout", "60"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".ddtk-grade",
        "ann",
        "canvas.csv",
        "grades.csv",
        "results.json",
    ]
    assert sorted(p.name for p in (out / "ann").iterdir()) == [
        "feedback.html", "gradescope.json", "lab99-tiny.executed.ipynb", "results.json"]  # fmt: skip
    assert json.loads((out / "results.json").read_text())["counts"]["pass"] == 1


def _cells(*sources: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


@pytest.mark.parametrize(
    ("source", "limits", "words"),
    [
        ("open('big', 'wb').write(b'x' * (48 << 20))\nimport time; time.sleep(3)",
         Limits(disk_mb=16), "over the disk limit of 16 MiB"),
        ("import threading, time\n"
         "ts = [threading.Thread(target=time.sleep, args=(5,)) for _ in range(200)]\n"
         "for t in ts: t.start()", Limits(tasks=96), "can't start new thread"),
        ("print('y' * (3 << 20))", Limits(cell_output_mb=1), "cell[0] sent more than 1 MiB of output"),
    ],
    ids=["disk", "tasks", "cell-output"],
)  # fmt: skip
def test_each_limit_stops_the_run_and_says_which(source: str, limits: Limits, words: str) -> None:
    _confined()
    run = execute(_cells(source, "print('after')"), timeout=60, memory_mb=4096, limits=limits)
    text = json.dumps(run.notebook.cells[0].get("outputs", []))
    assert words in (run.reason or "") + text, (run.status, run.reason, text[:500])


def test_without_namespaces_grading_still_runs_and_says_what_is_missing(
    monkeypatch, capsys
) -> None:
    monkeypatch.setenv("DDTK_GRADE_SANDBOX", "off")
    confinement.cache_clear()
    try:
        conf = confinement()
        assert not conf.namespaces and "DDTK_GRADE_SANDBOX=off" in conf.summary()
        run = execute(_cells("import os; print('pid', os.getpid())"), timeout=60)
        assert run.status == "completed", run.reason
        assert "pid" in run.notebook.cells[0].outputs[0]["text"]
    finally:
        monkeypatch.delenv("DDTK_GRADE_SANDBOX")
        confinement.cache_clear()
