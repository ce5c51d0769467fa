"""``ddtk course release``: the learners' tree holds no secret, refuses one, and runs ``make lab``.

The proof of "nothing leaks" is made twice: by the release's own check
(:mod:`ddtk.course.leaks`, which compares stripped lines) and here, independently, by a
plain substring search of every file of the release for every line of every solution
block, every line of the quiz key's feedback, reference solution and tests, and every
line of the project's reference (less what the learner's own material holds and the
reviewed ``solutions/release-allowed.json``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import nbformat
import pytest

from ddtk.course.cli import main
from ddtk.course.hub import nbgitpuller_link
from ddtk.course.release import ReleaseError, kit_files, make_release

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^\s*# BEGIN SOLUTION.*?\n(.*?)^\s*# END SOLUTION", re.S | re.M)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "class"
    make_release(ROOT, out, git=True)
    return out


def _texts(tree: Path) -> dict[str, str]:
    out = {}
    for path in tree.rglob("*"):
        if path.is_file() and ".git" not in path.relative_to(tree).parts:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            if path.suffix == ".ipynb":  # cell sources as written, not JSON-escaped
                text += "\n".join(c.source for c in nbformat.reads(text, as_version=4).cells)
            out[path.relative_to(tree).as_posix()] = text
    return out


def _secret_lines(text: str, public: str, allowed: set[str]) -> set[str]:
    lines = {ln.strip() for ln in text.splitlines()}
    return {
        ln for ln in lines
        if len(ln) >= 24 and ln not in public and ln not in allowed
        and not ln.startswith(("import ", "from "))
    }  # fmt: skip


def test_the_release_holds_no_solution_key_or_reference(release: Path) -> None:
    allowed = set(json.loads((ROOT / "solutions" / "release-allowed.json").read_text())["lines"])
    secrets: dict[str, set[str]] = {}
    for sol in sorted((ROOT / "solutions").glob("lab*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(sol, as_version=4).cells)
        stub = "\n".join(
            c.source for c in nbformat.read(ROOT / "labs" / sol.name, as_version=4).cells
        )
        blocks = "\n".join(_BLOCK.findall(code + "\n"))
        assert blocks, sol
        secrets[sol.name] = _secret_lines(blocks, stub, allowed)
    key = json.loads((ROOT / "solutions" / "quiz" / "module-quiz.key.json").read_text())
    public_quiz = (ROOT / "quizzes" / "module-quiz.yaml").read_text()
    key_text = "\n".join(
        [str(v) for q in key["questions"] for v in (q.get("feedback") or {}).values()]
        + [str(q.get(k, "")) for q in key["questions"] for k in ("solution", "tests")]
    )
    secrets["quiz key"] = _secret_lines(key_text, public_quiz, allowed)
    starter = "\n".join(p.read_text() for p in (ROOT / "project").rglob("*") if p.is_file())
    reference = "\n".join(p.read_text() for p in (ROOT / "solutions" / "project").iterdir())
    secrets["project reference"] = _secret_lines(reference, starter, allowed)
    assert all(len(s) >= 20 for s in secrets.values()), {k: len(v) for k, v in secrets.items()}
    texts = _texts(release)
    found = [(name, line, rel) for name, lines in secrets.items() for line in lines
             for rel, text in texts.items() if line in text]  # fmt: skip
    assert not found, found[:10]
    assert not (release / "solutions").exists() and not (release / "tests").exists()
    assert not list(release.rglob("*.key.json")) and not list(release.rglob("mutants"))


def test_the_release_is_the_learners_tree(release: Path) -> None:
    for lab in sorted((ROOT / "labs").glob("*.ipynb")):  # labs as stubs, byte for byte
        assert (release / "labs" / lab.name).read_bytes() == lab.read_bytes()
    for lecture in sorted((ROOT / "course").rglob("*.ipynb")):  # answers collapsed, as shipped
        assert (release / lecture.relative_to(ROOT)).read_bytes() == lecture.read_bytes()
    assert (release / "project" / "starter" / "train.py").is_file()
    assert (release / "quizzes" / "module-quiz.yaml").is_file()
    assert (release / "Makefile").is_file() and (release / "requirements.lock").is_file()
    readme = (release / "README.md").read_text()
    assert "make lab" in readme and "labs/lab01-ray-train.ipynb" in readme
    assert "solutions/" not in readme
    for page in sorted((ROOT / "resources").glob("*.md")):  # every reference page, linked
        assert f"](resources/{page.name})" in readme, page.name
        assert (release / "resources" / page.name).is_file(), page.name
    # the labs' judges are withheld; what a lab's check cell calls still runs
    withheld = (release / "ddtk" / "course" / "judges" / "lab03.py").read_text()
    assert "withheld" in withheld and "expected_findings" not in withheld
    namespace: dict = {}
    exec(compile(withheld, "lab03.py", "exec"), namespace)
    assert namespace["JUDGE"] is None
    namespace["judge"](4, {})
    assert (release / "ddtk" / "course" / "judges" / "lecture02.py").read_bytes() == (
        ROOT / "ddtk" / "course" / "judges" / "lecture02.py"
    ).read_bytes()
    log = subprocess.run(["git", "-C", str(release), "log", "--oneline"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert len(log.splitlines()) == 1
    tracked = subprocess.run(["git", "-C", str(release), "ls-files"], capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    assert len(tracked) == len(kit_files(ROOT)) + 1  # and the README


def _kit_copy(dst: Path) -> Path:
    for rel in [*kit_files(ROOT), *(p.relative_to(ROOT).as_posix()
                                    for p in (ROOT / "solutions").rglob("*") if p.is_file())]:  # fmt: skip
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst / rel)
    return dst


def test_a_planted_secret_stops_the_release_and_nothing_is_written(tmp_path: Path) -> None:
    kit = _kit_copy(tmp_path / "kit")
    sol = nbformat.read(kit / "solutions" / "lab03-fault-tolerant.ipynb", as_version=4)
    line = next(ln.strip() for ln in _BLOCK.findall("\n".join(c.source for c in sol.cells))[-1]
                .splitlines() if len(ln.strip()) > 40)  # fmt: skip
    (kit / "docs" / "notes.md").write_text(f"A helpful hint:\n\n    {line}\n")
    key = json.loads((kit / "solutions" / "quiz" / "module-quiz.key.json").read_text())
    feedback = key["questions"][0]["feedback"]["correct"].strip().splitlines()[0]
    (kit / "resources" / "faq.md").write_text(f"# Questions\n\n{feedback}\n")  # README links the title
    shutil.copy(kit / "solutions" / "project" / "design_numbers.py", kit / "project" / "dn.py")
    out = tmp_path / "out"
    with pytest.raises(ReleaseError) as exc:
        make_release(kit, out)
    message = str(exc.value)
    assert "docs/notes.md: 1 line(s) of the lab solution" in message
    assert "resources/faq.md: 1 line(s) of the quiz key" in message
    assert "project/dn.py: " in message and "of the project reference" in message
    assert "in 3 file(s); nothing written" in message
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["kit"]


def test_release_refuses_what_it_cannot_do_safely(tmp_path: Path, capsys) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    assert main(["release", str(busy), "--root", str(ROOT)]) == 2
    assert "is not an empty folder" in capsys.readouterr().err
    assert (busy / "mine.txt").read_text() == "keep me"
    assert main(["release", str(ROOT / "build" / "rel"), "--root", str(ROOT)]) == 2
    assert "inside the kit" in capsys.readouterr().err
    (tmp_path / "half" / "labs").mkdir(parents=True)
    assert main(["release", str(tmp_path / "x"), "--root", str(tmp_path / "half")]) == 2
    assert "is not the full course kit" in capsys.readouterr().err


def test_pull_link_is_what_nbgitpuller_reads(capsys) -> None:
    assert main(["pull-link", "--hub", "https://hub.example.edu/", "--repo",
                 "https://github.com/acme/dtas.git", "--open", "labs/lab01-ray-train.ipynb"]) == 0  # fmt: skip
    link = capsys.readouterr().out.strip()
    parts = urlsplit(link)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == (
        "https://hub.example.edu/hub/user-redirect/git-pull"
    )
    assert parse_qs(parts.query) == {"repo": ["https://github.com/acme/dtas.git"],
                                     "branch": ["main"],
                                     "urlpath": ["lab/tree/dtas/labs/lab01-ray-train.ipynb"]}  # fmt: skip
    moved = nbgitpuller_link("https://hub.example.edu", "https://gitlab.com/a/b", target="dtas-27")
    assert parse_qs(urlsplit(moved).query)["targetpath"] == ["dtas-27"]
    assert main(["pull-link", "--hub", "hub.example.edu", "--repo", "https://x.org/r"]) == 2
    assert "the hub must be a full URL" in capsys.readouterr().err
    with pytest.raises(ValueError, match="relative to the repository"):
        nbgitpuller_link("https://h.org", "https://x.org/r", path="../etc/passwd")


@pytest.mark.notebook
@pytest.mark.slow
def test_make_lab_inside_a_release_serves_the_release(release: Path, tmp_path: Path) -> None:
    import psutil
    from test_lab_command import _assert_all_gone, _isolated_env, _request

    # the kit's .venv, taken as installed (-o venv): the release's make must not reinstall
    # it from the release (that is make venv's job, which CI's own run of make proves)
    venv = Path(sys.executable).parent.parent
    token = "fedcba9876543210"
    log = tmp_path / "make.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["make", "lab", "-o", "venv", f"VENV={venv}"], cwd=release, stdout=out,
                                stderr=subprocess.STDOUT, env=_isolated_env(tmp_path, token),
                                start_new_session=True)  # fmt: skip
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            found = re.search(
                r"JupyterLab: (http://[^/\s]+)/lab/tree/(\S+)\?token=", log.read_text()
            )
            url, opened = (found.group(1), found.group(2)) if found else (None, None)
            time.sleep(0.5)
        assert opened == "course/01-distributed-fundamentals.ipynb"
        while (status := _status(url, token)) != 200:
            assert time.monotonic() < deadline, (status, log.read_text()[-3000:])
            time.sleep(0.5)
        status, body = _request(f"{url}/api/contents/labs", token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert status == 200 and "lab01-ray-train.ipynb" in names
        assert _request(f"{url}/api/contents/solutions", token)[0] == 404
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal that ran make
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _assert_all_gone(family)
    assert "pip install" not in log.read_text()


def _status(url: str, token: str) -> int | None:
    from test_lab_command import _request

    try:
        return _request(f"{url}/api/status", token)[0]
    except OSError:
        return None


# ---------------------------------------------------------------- collect, then grade


def _homes(release: Path, root: Path) -> Path:
    """Learners' homes holding copies of the release's labs/: ann solved lab 04, bob
    handed in the stub, eve's labs/ is a link to ann's, mia's notebook is a link to
    ann's, dan never opened the lab."""
    for who in ("ann", "bob", "eve", "mia", "dan"):
        (root / who / "class").mkdir(parents=True)
    name = "lab04-profiling.ipynb"
    shutil.copytree(release / "labs", root / "ann" / "class" / "labs")
    shutil.copy(ROOT / "solutions" / name, root / "ann" / "class" / "labs" / name)
    (root / "ann" / "class" / "labs" / "lab04-report.md").write_text("# my report\n")
    shutil.copytree(release / "labs", root / "bob" / "class" / "labs")
    (root / "eve" / "class" / "labs").symlink_to(root / "ann" / "class" / "labs")
    (root / "mia" / "class" / "labs").mkdir()
    (root / "mia" / "class" / "labs" / name).symlink_to(root / "ann" / "class" / "labs" / name)
    return root


def test_collect_takes_each_learners_own_files_only(release: Path, tmp_path: Path, capsys) -> None:
    homes = _homes(release, tmp_path / "home")
    out = tmp_path / "subs"
    assert main(["collect", f"{homes}/*/class", "lab04", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["ann", "bob"]
    assert sorted(p.name for p in (out / "ann").iterdir()) == [
        "lab04-profiling.ipynb",
        "lab04-report.md",
    ]
    assert "refused eve/labs: a link" in printed and "refused mia/lab04-profiling.ipynb" in printed
    assert "dan: no lab04-profiling.ipynb" in printed
    assert main(["collect", f"{homes}/*/class", "lab04", "--out", str(out)]) == 2  # never over
    assert "not an empty folder" in capsys.readouterr().err
    assert main(["collect", f"{homes}/ann/class", "lab04", "--out", str(tmp_path / "o")]) == 2
    assert "no wildcard" in capsys.readouterr().err


@pytest.mark.slow
def test_the_instructors_flow_release_collect_grade_export(
    release: Path, tmp_path: Path, execution_cache, capsys
) -> None:
    """What README's "Running a class" lists, one command per step, on lab 04."""
    from test_gradebook import assert_gradescope_results

    homes = _homes(release, tmp_path / "home")
    subs, out = tmp_path / "subs", tmp_path / "grades"
    main(["collect", f"{homes}/*/class", "lab04", "--out", str(subs)])
    roster = tmp_path / "canvas-export.csv"
    roster.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n"
                      "\"Ng, Ann\",11,S11,ann,A\n\"Ode, Bob\",12,S12,bob,A\n")  # fmt: skip
    code = main(["grade", "lab04", str(subs), "--out", str(out), "--cache", str(execution_cache.root),
                 "--canvas-roster", str(roster), "--canvas-column", "Lab 4 (5120)"])  # fmt: skip
    assert code == 1  # bob's stub fails
    capsys.readouterr()
    rows = {r["student"]: r for r in json.loads((out / "results.json").read_text())["students"]}
    assert rows["ann"]["status"] == "pass" and rows["bob"]["status"] == "fail"
    canvas = (out / "canvas.csv").read_text().splitlines()
    assert canvas[0].endswith("Lab 4 (5120)") and canvas[1].endswith(",16")
    assert '"Ng, Ann",11,S11,ann,A,16' in canvas and '"Ode, Bob",12,S12,bob,A,0' in canvas
    for who in ("ann", "bob"):
        assert_gradescope_results(json.loads((out / who / "gradescope.json").read_text()))
        page = (out / who / "feedback.html").read_text()
        assert ({"ann", "bob"} - {who}).pop() not in page
