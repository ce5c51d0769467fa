"""``resources/recommended-reading.md`` and ``resources/tools-and-frameworks.md`` hold.

The reading list holds every citation of the course, under the lecture (or lab) that
makes it: the citations are read from the notebooks by :mod:`ddtk.course.citations`.
The tool list states no version that its source does not: a pinned package against
``requirements.lock``, Horovod against ``scripts/build_horovod.sh`` (and the Makefile's
``make horovod``), a Debian package against the Makefile's ``DEBS``/``DEBS_BARE``, an
operator and its CRDs against ``deploy/schemas/PROVENANCE.json``; a version written
anywhere else on the page is an error. Every relative link of both pages resolves, and
every "Used in" link of a tool goes to a file that mentions the tool.

Text only: no process, no kernel, well under a second each.
"""

from __future__ import annotations

import doctest
import functools
import json
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

from ddtk.course import book, citations
from ddtk.course.citations import Citation, check_reading_list, prose_citations, reading_citations

ROOT = Path(__file__).resolve().parents[1]
READING = ROOT / "resources" / "recommended-reading.md"
TOOLS = ROOT / "resources" / "tools-and-frameworks.md"
# The tools the module overview names: each must have a section of the tool list.
OVERVIEW_TOOLS = ("Ray (", "Ray Train", "Ray Tune", "Horovod", "PyTorch DDP", "FSDP2",
                  "Distributed checkpoint", "torchrun", "DeepSpeed", "MultiWorkerMirroredStrategy",
                  "NCCL (", "gloo", "MPI (", "KubeRay", "Kubeflow Trainer", "MPI Operator",
                  "Slurm", "Kubernetes", "Prometheus (", "Grafana", "TensorBoard", "DCGM",
                  "PyTorch profiler", "py-spy", "Nsight Systems", "papermill", "nbval",
                  "JupyterLab")  # fmt: skip
_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?==(\S+)$")
_OPERATOR = re.compile(r"^([a-z][a-z0-9-]*) (v\d\S*)$")
_CRD = re.compile(r"^([a-z0-9.-]+\.[a-z]+)/(v\w+) ([A-Z]\w+)$")
_DEBIAN = re.compile(r"Debian package `([^`]+)`")
_STRAY = re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.\d+)*")


# ---------------------------------------------------------------- the versions' sources


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    """``requirements.lock``: package (PEP 503 name) -> pinned version."""
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==(\S+)", line)
        if m:
            pins[_canonical(m.group(1))] = m.group(2)
    return pins


def horovod_version() -> str:
    """The Horovod that ``make horovod`` builds: ``HVD_VERSION`` of the build script, which
    the Makefile's help for ``make horovod`` must name too."""
    script = re.search(
        r"^HVD_VERSION=(\S+)$", (ROOT / "scripts/build_horovod.sh").read_text(), re.M
    )
    target = re.search(r"^horovod:.*## build Horovod (\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert script and target, "HVD_VERSION or the `make horovod` help line is gone"
    assert script.group(1) == target.group(1), (
        f"scripts/build_horovod.sh builds Horovod {script.group(1)}, the Makefile says "
        f"{target.group(1)}"
    )
    return script.group(1)


def debian_packages() -> set[str]:
    """The Debian packages ``make debs`` installs: the Makefile's ``DEBS`` (commands,
    renamed to their package by the target's own ``sed``) and ``DEBS_BARE``."""
    make = (ROOT / "Makefile").read_text()
    names = set()
    for var in ("DEBS", "DEBS_BARE"):
        m = re.search(rf"^{var}\s*:=\s*([^#\n]*)", make, re.M)
        assert m, f"the Makefile has no {var}"
        names.update(m.group(1).split())
    renames = dict(re.findall(r"s/\^(\w+)\$\$/(\w+)/", make))
    return {renames.get(n, n) for n in names}


def provenance() -> tuple[dict[str, str], set[tuple[str, str, str]]]:
    """``deploy/schemas/PROVENANCE.json``: operator -> its version (the first word of
    ``operator_version``), and every (group, version, kind) with a schema."""
    schemas = json.loads((ROOT / "deploy/schemas/PROVENANCE.json").read_text())["schemas"]
    operators = {s["operator"]: s["operator_version"].split()[0] for s in schemas.values()}
    kinds = {(s["group"], s["version"], s["kind"]) for s in schemas.values()}
    return operators, kinds


def version_problems(text: str) -> list[str]:
    """Every version on the tool page that disagrees with its source, or has none."""
    pins, hvd, debs = locked(), horovod_version(), debian_packages()
    operators, kinds = provenance()
    problems, recognised = [], []
    for m in _SPAN.finditer(text):
        span = m.group(1)
        pin, op, crd = _PIN.match(span), _OPERATOR.match(span), _CRD.match(span)
        if pin:
            name, said = _canonical(pin.group(1)), pin.group(2)
            source, real = (("scripts/build_horovod.sh", hvd) if name == "horovod"
                            else ("requirements.lock", pins.get(name)))  # fmt: skip
            if said != real:
                problems.append(f"`{span}`: {source} has {name}=={real}" if real
                                else f"`{span}`: {source} pins no {name}")  # fmt: skip
        elif op and op.group(1) in operators:
            if op.group(2) != operators[op.group(1)]:
                problems.append(f"`{span}`: deploy/schemas/PROVENANCE.json has "
                                f"{op.group(1)} {operators[op.group(1)]}")  # fmt: skip
        elif crd:
            if (crd.group(1), crd.group(2), crd.group(3)) not in kinds:
                problems.append(f"`{span}`: deploy/schemas/PROVENANCE.json has no schema for it")
        else:
            continue
        recognised.append(m.span())
    for m in _DEBIAN.finditer(text):
        if m.group(1) not in debs:
            problems.append(f"Debian package `{m.group(1)}`: the Makefile's DEBS/DEBS_BARE "
                            f"install {sorted(debs)}")  # fmt: skip
    rest = list(text)
    for start, end in recognised:
        rest[start:end] = " " * (end - start)
    residue = _LINK.sub(lambda m: m.group(1), "".join(rest))
    problems += [f"{m.group(0)!r} (line {residue.count(chr(10), 0, m.start()) + 1}) is a version "
                 "without a source: write it as `name==version`, `operator vX` or "
                 "`group/version Kind`, or leave it out" for m in _STRAY.finditer(residue)]  # fmt: skip
    return problems


# ---------------------------------------------------------------- the tool sections


def tool_sections(text: str) -> list[tuple[str, list[str], str]]:
    """``(heading, names, body)`` of every ``###`` tool section: its names are the
    heading's words before the parenthesis and each code span of the heading."""
    parts = re.split(r"^### (.*)$", text, flags=re.M)
    out = []
    for heading, body in zip(parts[1::2], parts[2::2]):
        body = re.split(r"^## ", body, flags=re.M)[0]
        names = [heading.split(" (")[0].strip(), *_SPAN.findall(heading)]
        out.append((heading, names, body))
    return out


def _field(body: str, label: str) -> str:
    m = re.search(rf"^- \*\*{label}:\*\*(.*)$", body, re.M)
    return m.group(1) if m else ""


@functools.cache
def file_text(path: Path) -> str:
    """A notebook's cell sources, or a file's text (read once per test session)."""
    if path.suffix == ".ipynb":
        return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    return path.read_text(encoding="utf-8", errors="replace")


def mentions(text: str, name: str) -> bool:
    """Whether ``text`` names ``name`` as a whole word, in any case ("ray" is not in "array")."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.I) is not None


def used_in_problems(text: str, page: Path = TOOLS) -> list[str]:
    """Every "Used in" link of the tool page whose file names none of the tool's names."""
    problems = []
    for heading, names, body in tool_sections(text):
        for _label, target in _LINK.findall(_field(body, "Used in")):
            file = (page.parent / target.split("#")[0]).resolve()
            if not file.is_file():
                problems.append(f"{heading}: {target} is not a file")
            elif not any(mentions(file_text(file), n) for n in names):
                problems.append(f"{heading}: {target} mentions none of {names}")
    return problems


def link_problems(page: Path, text: str) -> list[str]:
    """Relative links of ``page`` that resolve to nothing, or go where learners' copies
    of the kit do not (``solutions/``, ``tests/``)."""
    problems = []
    for _label, target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        file = (page.parent / target.split("#")[0]).resolve()
        rel = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else str(file)
        if not file.exists():
            problems.append(f"{page.name}: {target} does not exist")
        elif rel.startswith(("solutions/", "tests/")):
            problems.append(f"{page.name}: {target} is not in the learners' release")
    return problems


# ---------------------------------------------------------------- the reading list


@pytest.fixture(scope="module")
def course_citations() -> list[Citation]:
    """Every citation of the lectures, labs and project, read once for the module."""
    return [
        c for p in citations.course_sources(ROOT) for c in citations.notebook_citations(ROOT, p)
    ]


def unlisted_in(text: str, cited: list[Citation]) -> set[str]:
    """The messages for ``cited`` against a reading list with the text ``text``."""
    return set(citations.unlisted(cited, citations.reading_list_sections(text)))


def test_every_citation_of_the_course_is_in_the_reading_list() -> None:
    problems = check_reading_list(ROOT)
    assert not problems, "\n".join(problems)


def _without_entry(text: str, start: str, after: str = "") -> str:
    """``text`` without the list item that begins ``start`` (the first after ``after``)."""
    at = text.index(start, text.index(after) if after else 0)
    return text[:at] + text[text.index("\n", at) + 1 :]


def test_a_removed_entry_is_named_with_its_citation_and_lecture(
    course_citations: list[Citation],
) -> None:
    text = READING.read_text()
    before = unlisted_in(text, course_citations)  # empty unless a lecture is mid-edit
    young = _without_entry(text, "- J. W. Young", "## Lecture 06")
    (message,) = unlisted_in(young, course_citations) - before  # lecture 07's entry stands
    assert "course/06-fault-tolerance.ipynb cites 'Young 1974'" in message
    assert "under '## Lecture 06'" in message and "contains 'Young' and '1974'" in message
    gcs = _without_entry(text, "- Google Cloud, *Cloud Storage consistency*")
    (message,) = unlisted_in(gcs, course_citations) - before
    assert "cites 'Cloud Storage consistency 2025'" in message and "'## Lecture 06'" in message


def test_the_extractor_on_the_forms_the_lectures_use() -> None:
    prose = ("Korthikanti et al. (2022, *Reducing*) and (Sergeev and Del Balso, 2018); "
             "Thakur, Rabenseifner and Gropp (2005); Gustafson's law (1988) and Daly (2006); "
             "(S. Jeaugey, NVIDIA/nccl #457, 2021); (Ren et al., USENIX ATC 2021).")  # fmt: skip
    assert [c.key for c in prose_citations(prose)] == [
        "Korthikanti 2022", "Sergeev 2018", "Thakur 2005", "Gustafson 1988", "Daly 2006",
        "Jeaugey 2021", "Ren 2021"]  # fmt: skip
    not_citations = ("(SHA-NI: AMD since Zen, 2017; Intel since Ice Lake, 2019); since "
                     "December 2020 (AWS announcement); `growth_interval=2000`; arXiv:2001.08361; "
                     "the wrapper of 2021 to 2023; Lecture 4 (2019)")  # fmt: skip
    assert prose_citations(not_citations) == []
    reading = ("- P. Moritz, R. Nishihara et al., *Ray*, OSDI 2018; the Ray Team, *Ray v2 "
               "Architecture* white paper (2022).\n- PyTorch docs: *torchrun (Elastic Launch)*; "
               "NVIDIA A100 and H100 datasheets: throughputs.\n- [ref](../resources/x.md): tables\n"
               "- [DCGM docs](https://docs.nvidia.com/datacenter/dcgm/)")  # fmt: skip
    assert [c.key for c in reading_citations(reading)] == [
        "Moritz 2018", "Ray v2 Architecture 2022", "torchrun (Elastic Launch)",
        "NVIDIA A100 and H100 datasheets", "DCGM docs"]  # fmt: skip
    assert doctest.testmod(citations, verbose=False).failed == 0


def test_an_entry_lists_a_work_only_under_its_first_author() -> None:
    zero = Citation("Rajbhandari", "2020", None, "Rajbhandari et al. 2020")
    deepspeed_entry = "J. Rasley, S. Rajbhandari, O. Ruwase, Y. He, *DeepSpeed*, KDD 2020."
    assert not citations.lists(deepspeed_entry, zero)
    assert citations.lists("S. Rajbhandari, J. Rasley, *ZeRO*, SC 2020.", zero)
    assert not citations.lists("S. Rajbhandari et al., *ZeRO-Infinity*, SC 2021.", zero)
    assert citations.lists("Z. Wang et al., *Träff*-free, 2023", Citation("Wang", "2023", None, ""))


def test_every_entry_has_a_year_and_a_link() -> None:
    sections = citations.reading_list_sections(READING.read_text())
    assert {f"Lecture 0{n}" for n in range(1, 8)} <= set(sections)
    bad = [e[:80] for entries in sections.values() for e in entries
           if not _LINK.search(e) or not (re.search(r"\b(19|20)\d\d\b", _LINK.sub("", e))
                                          or "undated" in e)]  # fmt: skip
    assert not bad, f"entries without a link, or without a year or 'undated': {bad}"


# ---------------------------------------------------------------- the tool list


def test_every_version_stated_matches_its_source() -> None:
    problems = version_problems(TOOLS.read_text())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("`torch==2.13.0`", "`torch==2.12.0`", "requirements.lock has torch=="),
        ("`horovod==0.28.1`", "`horovod==0.28.0`", "scripts/build_horovod.sh has horovod=="),
        ("`kuberay v1.7.0`", "`kuberay v1.6.0`", "PROVENANCE.json has kuberay v"),
        ("`ray.io/v1 RayJob`", "`ray.io/v2 RayJob`", "has no schema for it"),
        ("Debian package `iperf3`", "Debian package `iperf4`", "DEBS/DEBS_BARE install"),
        ("`optuna==5.0.0`", "`optuna==5.0.0` (Optuna 5.1 adds more)", "'5.1' (line"),
        ("`cmake==4.4.4`", "`cmakery==4.4.4`", "requirements.lock pins no cmakery"),
    ],
)  # fmt: skip
def test_a_wrong_or_unsourced_version_is_caught(old: str, new: str, expected: str) -> None:
    text = TOOLS.read_text()
    assert old in text
    problems = version_problems(text.replace(old, new, 1))
    assert len(problems) == 1 and expected in problems[0], problems


def test_every_tool_has_a_version_line_and_where_it_is_used() -> None:
    sections = tool_sections(TOOLS.read_text())
    headings = [h for h, _, _ in sections]
    missing = [t for t in OVERVIEW_TOOLS if not any(h.startswith(t) or t in h for h in headings)]
    assert not missing, f"tools of the module overview without a section: {missing}"
    for heading, _names, body in sections:
        version = _field(body, "Version tested here")
        stated = _SPAN.search(version) or "Debian package" in version
        assert stated or "not run here" in version, f"{heading}: no version and not 'not run here'"
        assert _LINK.search(_field(body, "Used in")), f"{heading}: no 'Used in' link"


def test_every_relative_link_resolves() -> None:
    problems = [p for page in (READING, TOOLS) for p in link_problems(page, page.read_text())]
    assert not problems, "\n".join(problems)


def test_every_used_in_link_mentions_its_tool() -> None:
    text = TOOLS.read_text()
    assert not used_in_problems(text), "\n".join(used_in_problems(text))
    wrong = text.replace("[`ddtk/examples/cnn_deepspeed.py`](../ddtk/examples/cnn_deepspeed.py)",
                         "[`ddtk/examples/cnn_tf.py`](../ddtk/examples/cnn_tf.py)")  # fmt: skip
    assert used_in_problems(wrong) == [
        "DeepSpeed (`deepspeed`): ../ddtk/examples/cnn_tf.py mentions none of "
        "['DeepSpeed', 'deepspeed']"]  # fmt: skip


def test_the_readme_and_the_course_site_pick_up_both_pages() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in (READING, TOOLS):
        rel = page.relative_to(ROOT).as_posix()
        assert f"]({rel})" in readme, f"README.md does not link {rel}"
        assert any(fnmatch(rel, pattern) for pattern in book.REFERENCE), rel
    assert "(tools-and-frameworks.md)" in READING.read_text()
    assert "(recommended-reading.md)" in TOOLS.read_text()
