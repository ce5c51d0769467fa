"""The course site as built by ``make book``: every page, every link, no answer, and a browser.

``make test`` runs this after the main suite has executed every notebook and ``make
book`` has built the site from them (``build/book/_build/html``). Run alone, it builds
the site first when the executed notebooks are there, and skips (fails, when
``DDTK_REQUIRE`` names ``book``) when they are not.

The browser part opens lecture 01 in Debian's Chromium (Playwright, no browser
download) served over HTTP, checks that its figures really loaded (each image has a
natural width), that Sphinx's search finds pages, and keeps a screenshot in
``build/book-lecture01.png``.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from support import require_or_skip

from ddtk.course import catalog
from ddtk.course.book import BOOK_OUT, HTML, build
from ddtk.course.executed import EXECUTED_NOTEBOOKS
from ddtk.course.leaks import find_leaks

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def site() -> Path:
    html = ROOT / BOOK_OUT / HTML
    if not (html / "index.html").is_file():
        if not (ROOT / EXECUTED_NOTEBOOKS / "course").is_dir():
            require_or_skip("book", "no executed notebooks in build/executed/notebooks: make test")
        build(ROOT)
    return html


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and ((tag == "a" and name == "href") or (tag == "img" and name == "src")):
                self.refs.append((tag, value))


def test_every_notebook_and_page_has_its_html(site: Path) -> None:
    for entry in catalog.in_course_order():
        if entry.kind == "lab":
            page = f"labs/{Path(entry.path).stem}.html"
        elif entry.kind == "quiz":
            page = "quizzes/module-quiz.html"
        else:
            page = str(Path(entry.path).with_suffix(".html"))
        assert (site / page).is_file(), page
    for page in ("project/README.html", "docs/benchmarks.html", "deploy/README.html",
                 "resources/04-nccl-reference.html", "search.html", "searchindex.js"):  # fmt: skip
        assert (site / page).is_file(), page
    lecture = (site / "course" / "05-mixed-precision.html").read_text()
    assert "Executed in " in lecture and " CPUs (" in lecture  # run time and machine
    assert "<img" in lecture  # executed figures inline


def test_every_internal_link_and_image_resolves(site: Path) -> None:
    broken, checked = [], 0
    for page in sorted(site.rglob("*.html")):
        parser = _Refs()
        parser.feed(page.read_text(encoding="utf-8"))
        for tag, ref in parser.refs:
            parts = urlsplit(ref)
            if parts.scheme or parts.netloc or not parts.path or ref.startswith("#"):
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            checked += 1
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {tag} {ref}")
    assert checked > 500 and not broken, broken[:20]


def test_no_solution_quiz_answer_or_lecture_answer_on_the_site(site: Path) -> None:
    assert find_leaks(ROOT, site, lecture_answers=True) == []
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "BEGIN SOLUTION" not in text and "keep_yours(globals())" not in text, page


@contextlib.contextmanager
def _serve(folder: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_browser_sees_the_figures_and_the_search_works(site: Path) -> None:
    if not CHROMIUM.exists():
        require_or_skip("browser", f"{CHROMIUM} is missing (as root: apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_or_skip("browser", "Playwright is not installed here (pip install -e '.[dev]')")
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
    with _serve(site) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=flags)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/course/01-distributed-fundamentals.html", wait_until="load")
            widths = page.eval_on_selector_all(
                "article img", "imgs => imgs.map(i => [i.complete, i.naturalWidth, i.src])"
            )
            assert widths and all(done and w > 0 for done, w, _src in widths), widths
            page.screenshot(path=str(ROOT / "build" / "book-lecture01.png"), full_page=False)
            page.goto(f"{url}/search.html?q=allreduce", wait_until="load")
            page.wait_for_selector("#search-results ul.search li a", timeout=30_000)
            found = page.eval_on_selector_all(
                "#search-results ul.search li a", "links => links.map(a => a.getAttribute('href'))"
            )
            assert any("04-nccl-and-networking" in h for h in found), found
        finally:
            browser.close()
    assert (ROOT / "build" / "book-lecture01.png").stat().st_size > 20_000
