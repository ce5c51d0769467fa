"""The quiz notebook in a real browser: JupyterLab plus headless Chromium via Playwright.

The test starts JupyterLab on a free localhost port in a temporary folder holding the
quiz notebook and the public and self-check files, opens the notebook in Debian's
Chromium (``/usr/bin/chromium``, driven by Playwright; no browser download), runs all
cells, answers four questions by clicking and typing, enters a student id and presses
"Save and check". It then checks the score shown in the page against a score computed
here from the private key, and the answers file written on disk. Screenshots go to
``build/quiz-browser-form.png`` (answers given) and ``build/quiz-browser.png`` (result).

Without Chromium or Playwright the test skips with the reason, unless ``DDTK_REQUIRE``
names ``browser``: then it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import psutil
import pytest
import yaml
from support import require_or_skip

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
KEY = ROOT / "solutions" / "quiz" / "module-quiz.key.json"
QUIZ_FILES = ("module-quiz.ipynb", "module-quiz.yaml", "module-quiz.selfcheck.json")
STUDENT = "browser-test-1"
SCREENSHOT = ROOT / "build" / "quiz-browser.png"


def _require_browser() -> None:
    if not CHROMIUM.is_file():
        require_or_skip("browser", f"{CHROMIUM} is missing (as root: apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        require_or_skip(
            "browser", "Playwright for Python is not installed (pip install playwright)"
        )
    if not Path(sys.executable).with_name("jupyter").is_file():
        require_or_skip("browser", "JupyterLab is not installed here (pip install -e '.[course]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(root: Path, home: Path) -> Iterator[str]:
    """Run JupyterLab on ``root`` in its own process group; yield its base URL with token.

    On exit the whole group gets SIGTERM (the server shuts its kernels down), then any
    process of it still alive gets SIGKILL.
    """
    port, token = _free_port(), secrets.token_hex(16)
    # No news pop-up and no kernel dialog: they would cover the form.
    for plugin, values in (
        ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
        ("docmanager-extension/plugin", {"autoStartDefaultKernel": True}),
    ):
        settings = home / "lab-settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(values))
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
    )
    cmd = [
        str(Path(sys.executable).with_name("jupyter")),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (home / "lab.log").open("w")
    lab = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            if lab.poll() is not None:
                raise RuntimeError(f"JupyterLab exited: {(home / 'lab.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("JupyterLab did not answer within 120 s") from None
                time.sleep(0.5)
        yield f"{base}/lab/tree/module-quiz.ipynb?token={token}"
    finally:
        family = [lab, *psutil.Process(lab.pid).children(recursive=True)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(lab.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(family, timeout=20)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        lab.wait(timeout=5)
        log.close()


def _key_questions() -> list[dict]:
    return json.loads(KEY.read_text())["questions"]


def _pick(questions: list[dict], kind: str, checkable: bool = True) -> dict:
    for q in questions:
        if q["type"] == kind and (not checkable or Fraction(str(q.get("rtol", 0))) == 0):
            return q
    raise AssertionError(f"the quiz has no {kind} question")


def test_missing_browser_skips_or_fails_by_policy(monkeypatch, tmp_path) -> None:
    """A missing Chromium skips with the reason, or fails where DDTK_REQUIRE names browser."""
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("DDTK_REQUIRE", "horovod")
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        _require_browser()
    monkeypatch.setenv("DDTK_REQUIRE", "horovod,browser")
    with pytest.raises(pytest.fail.Exception, match="browser is required"):
        _require_browser()


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.timeout(400)
def test_quiz_notebook_in_jupyterlab(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    root = tmp_path / "quiz"
    root.mkdir()
    for name in QUIZ_FILES:
        shutil.copy(ROOT / "quizzes" / name, root / name)
    questions = _key_questions()
    single, multi = _pick(questions, "single"), _pick(questions, "multi")
    numeric, text = _pick(questions, "numeric"), _pick(questions, "text")
    choice_text = {q["id"]: {c["id"]: c["text"] for c in q.get("choices", [])} for q in questions}
    wrong_text = "all-gather then broadcast"
    assert wrong_text not in text["answer"]
    # The self-check judges every question but code and relative-tolerance numerics.
    checkable = [
        q for q in questions if q["type"] != "code" and Fraction(str(q.get("rtol", 0))) == 0
    ]
    max_score = sum(Fraction(str(q.get("points", 1))) for q in checkable)
    score = sum(Fraction(str(q.get("points", 1))) for q in (single, multi, numeric))

    def frac(x: Fraction) -> str:
        return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"

    with jupyter_lab(root, tmp_path) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.set_default_timeout(60_000)
            page.goto(url)
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
            select = page.locator(".jp-Dialog").get_by_role("button", name="Select")
            with contextlib.suppress(PlaywrightTimeout):
                select.click(timeout=5_000)  # the kernel dialog, should it still appear
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.get_by_text("Run All Cells", exact=True).click()
            page.wait_for_selector(".ddtk-quiz-save", timeout=120_000)

            student = page.locator(".ddtk-quiz-student input")
            student.fill(STUDENT)
            student.press("Enter")
            expect(page.locator(".ddtk-quiz-shown-for")).to_contain_text(STUDENT)

            box = page.locator(f".ddtk-quiz-q-{single['id']}")
            box.get_by_label(choice_text[single["id"]][single["answer"]], exact=True).check()
            box = page.locator(f".ddtk-quiz-q-{multi['id']}")
            for cid in multi["answer"]:
                box.get_by_label(choice_text[multi["id"]][cid], exact=True).check()
            page.locator(f".ddtk-quiz-q-{numeric['id']} input").fill(f" {numeric['answer']} ")
            page.locator(f".ddtk-quiz-q-{text['id']} input").fill(wrong_text)
            box.scroll_into_view_if_needed()
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT.with_name("quiz-browser-form.png")))
            page.locator(".ddtk-quiz-save").click()

            result = page.locator(".ddtk-quiz-result")
            expect(result).to_contain_text(f"Self-check for {STUDENT}", timeout=60_000)
            shown = result.inner_text()
            result.scroll_into_view_if_needed()
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT))
        except Exception:
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT.with_name("quiz-browser-failure.png")))
            raise
        finally:
            browser.close()

    assert f"score {frac(score)}/{frac(max_score)}" in shown, shown
    assert "not yet passed" in shown
    for q, status in ((single, "correct"), (multi, "correct"), (numeric, "correct")):
        assert re.search(rf"{re.escape(q['id'])}\s+✔ correct", shown), (q["id"], status, shown)
    assert re.search(rf"{re.escape(text['id'])}\s+✘ not yet", shown), shown

    saved = yaml.safe_load((root / f"module-202-{STUDENT}.answers.yaml").read_text())
    assert saved["quiz"] == "module-202" and saved["version"] == 1
    assert saved["student"] == STUDENT
    assert isinstance(saved["seed"], int)
    assert saved["answers"] == {
        single["id"]: single["answer"],
        multi["id"]: sorted(multi["answer"]),
        numeric["id"]: str(numeric["answer"]),
        text["id"]: wrong_text,
    }
