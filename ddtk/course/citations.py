"""What the course cites, and whether ``resources/recommended-reading.md`` lists it.

A lecture cites work in two places: its **Further reading** section (a list of papers
and documents) and its prose (author-year citations such as "Young (1974)" or
"(Li et al., VLDB 2020)"). This module reads both from a notebook's markdown cells and
turns each into a :class:`Citation`: the strings an entry of the reading list must
contain for that citation to count as listed (its *needles*). Nothing is imported or
executed; the notebooks are read as JSON.

The rules, chosen to be robust to how a citation is phrased but not vacuous:

- **A work by people** (initials, "et al.", "and", or several names before the title)
  is keyed by its first author's surname and its year: ``Rajbhandari et al., *ZeRO*
  (2020)`` and ``S. Rajbhandari, J. Rasley, ..., SC 2020`` are the same citation, so a
  shortened title never breaks the match. Two years for one work (an arXiv preprint
  and its venue) are two citations, and one entry that states both years matches both.
- **A document** (vendor or project documentation, a datasheet, a specification) is
  keyed by each of its titles (in ``*italics*``, ``"quotes"`` or ``code``) and the year
  that follows the title, if any; an entry must contain the title itself.
- A Further-reading chunk with neither (``NVIDIA A100 and H100 datasheets: ...``) is
  keyed by its leading phrase. A chunk that only points to another page of the kit
  (``[resources/...](...)``) is not a citation.
- **Prose** counts only author-year forms: ``Name et al. YEAR``, ``Name et al. (YEAR``,
  ``Name, Name and Name YEAR``, ``Name and Name, VENUE YEAR``, ``(Name, YEAR)``,
  ``(Name YEAR)``, ``Name (YEAR)`` and ``Name's law (YEAR)``, with an optional
  ``*title*`` and up to three venue words (``USENIX ATC``, ``arXiv 2506.20252``,
  ``datasheet``) between the names and the year. "Intel since Ice Lake, 2019",
  "December 2020" or ``growth_interval=2000`` are not citations; code spans, fenced code
  and link targets are never read.

An entry *lists* a citation when it contains every needle, compared without case,
accents, emphasis or dash variants, surnames and years as whole words; for a work by
people the entry must also *start* with that first author, so the ZeRO paper's entry
(Rajbhandari, Rasley, ...) never stands in for DeepSpeed's (Rasley, Rajbhandari, ...).
Two works by the same first author in the same year are not told apart.

>>> [c.key for c in prose_citations("as Young (1974) showed; see (Li et al., VLDB 2020).")]
['Young 1974', 'Li 2020']
>>> [c.key for c in prose_citations("SHA-NI: AMD since Zen, 2017; Intel since Ice Lake, 2019")]
[]
>>> [c.key for c in reading_citations("- Kaplan et al., *Scaling Laws* (2020); NVIDIA, *NCCL User Guide*")]
['Kaplan 2020', 'NCCL User Guide']
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

READING_LIST = Path("resources") / "recommended-reading.md"

# A year of publication: not part of an arXiv id (2001.08361), a number or a version.
_YEAR = r"(?<![\w.:/#=-])(?:19[5-9]\d|20[0-4]\d)(?![\w]|\.\d)"
_NAME = r"[A-Z][\w'’/-]*\w"  # a surname or organisation: Träff, Del, NVIDIA/nccl, Check-N-Run
_INITIALS = r"(?:[A-Z]\.\s?){1,3}"
_AUTHOR = rf"(?:{_INITIALS}\s?)?{_NAME}(?:\s{_NAME})?"  # "S. Jeaugey", "Del Balso"
# Words allowed between the names and the year besides capitalised ones (venues, ids).
_DOC_WORDS = ("arXiv", "datasheet", "datasheets", "release", "notes", "documentation", "docs",
              "blog", "guide", "manual", "paper", "issue", "announcement")  # fmt: skip
_TOKEN = rf"(?:[A-Z0-9#§][^\s,;()*]*|(?:{'|'.join(_DOC_WORDS)})[^\s,;()*]*)"
_BETWEEN = rf"(?:,\s*|\s+|\s*\(\s*)(?:\*[^*\n]{{1,160}}\*[,.]?\s*)?(?:{_TOKEN},?\s+){{0,3}}?"
_PROSE = re.compile(
    "|".join([
        rf"(?P<etal>{_AUTHOR})\s+et al\.?{_BETWEEN}(?P<y1>{_YEAR})",
        rf"(?P<andlist>{_AUTHOR}(?:,\s*{_AUTHOR})*,?\s+and\s+{_AUTHOR}){_BETWEEN}(?P<y2>{_YEAR})",
        rf"(?:(?<=\()|(?<=;\s))(?P<single>{_AUTHOR}){_BETWEEN}(?P<y3>{_YEAR})",
        rf"(?P<named>{_NAME})(?:'s law)?\s\(\s*(?:{_TOKEN}\s)?(?P<y4>{_YEAR})",
    ])
)  # fmt: skip
# Capitalised words that start sentences or name things, never a cited author.
NOT_AUTHORS = frozenset({
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December", "Lecture", "Lab", "Section", "Figure", "Table",
    "Exercise", "Part", "Step", "Version", "Since", "In", "The", "See", "From", "Until",
})  # fmt: skip
_LEAD_AUTHORS = re.compile(
    rf"^(?:the\s+)?(?P<authors>{_AUTHOR}(?:,\s*{_AUTHOR})*(?:,?\s+and\s+{_AUTHOR})?)"
    rf"(?P<etal>\s+et al\.)?(?=,|\s*\(|\s+et al)"
)
_TITLE = re.compile(r"\*([^*\n]+)\*|\"([^\"\n]+)\"|“([^”\n]+)”")
_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.M)
_FURTHER = re.compile(r"^(?:\d+\.\s*)?further reading\b", re.I)
_FENCE = re.compile(r"```.*?```", re.S)
_AND_THE = re.compile(r",? and the ")


@dataclass(frozen=True)
class Citation:
    """One cited work or document, with what a reading-list entry must contain.

    ``author`` and ``year`` key a work by people; ``title`` (and ``year`` when one
    follows it) key a document. ``where`` is the section of the reading list it belongs
    to ("Lecture 01", "Lab 02"), ``source`` the notebook it came from and ``text`` the
    words it was read from, for messages.
    """

    author: str | None
    year: str | None
    title: str | None
    text: str
    where: str = ""
    source: str = ""

    @property
    def needles(self) -> tuple[str, ...]:
        """The strings an entry must contain (author or title first, then the year)."""
        head = self.author if self.author else self.title
        return tuple(s for s in (head, self.year) if s)

    @property
    def key(self) -> str:
        """A short name: ``Young 1974`` or ``NCCL User Guide``."""
        return " ".join(self.needles)


# ---------------------------------------------------------------- text helpers


def normalise(text: str) -> str:
    """Lower case without accents, markdown emphasis, code ticks or dash and quote
    variants, whitespace collapsed: the form in which needles and entries are compared."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = re.sub(r"[‐-―−]", "-", text)
    text = re.sub(r"[‘’]", "'", text).replace("“", '"').replace("”", '"')
    text = text.replace("*", "").replace("`", "").replace("\\", "")
    return re.sub(r"\s+", " ", text).strip().lower()


def contains(entry: str, needle: str) -> bool:
    """Whether ``entry`` contains ``needle``: whole words for a surname or a year,
    a plain substring for a title (both normalised)."""
    n, e = normalise(needle), normalise(entry)
    if re.fullmatch(r"[\w'/-]+", n):
        return re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", e) is not None
    return n in e


def _strip_code_and_links(text: str) -> str:
    """Prose without fenced code, inline code, or link targets (link labels kept)."""
    text = _FENCE.sub(" ", text)
    text = _CODE.sub(" ", text)
    return _LINK.sub(lambda m: m.group(1), text)


def _surname(authors: str) -> str:
    """The first author's surname from ``S. Rajbhandari, J. Rasley`` or ``Del Balso``."""
    first = re.split(r",\s*|\s+and\s+", authors.strip())[0]
    return re.sub(rf"^{_INITIALS}\s?", "", first).strip()


# ---------------------------------------------------------------- prose


def prose_citations(text: str) -> list[Citation]:
    """The author-year citations in markdown prose (see the module docstring for forms)."""
    found: list[Citation] = []
    for m in _PROSE.finditer(_strip_code_and_links(text)):
        authors = next(m.group(g) for g in ("etal", "andlist", "single", "named") if m.group(g))
        year = next(m.group(g) for g in ("y1", "y2", "y3", "y4") if m.group(g))
        author = _surname(authors)
        if author.split()[0] in NOT_AUTHORS:
            continue
        found.append(Citation(author, year, None, m.group(0)))
    return found


# ---------------------------------------------------------------- further reading


def split_further_reading(markdown: str) -> tuple[str | None, str]:
    """``(section, rest)``: a cell's Further reading section (heading to the next heading
    of the same or a higher level), or None, and the cell's other text."""
    headings = list(_HEADING.finditer(markdown))
    for i, h in enumerate(headings):
        if _FURTHER.match(h.group(2).strip()):
            level = len(h.group(1))
            end = next((n.start() for n in headings[i + 1 :] if len(n.group(1)) <= level),
                       len(markdown))  # fmt: skip
            return markdown[h.end() : end], markdown[: h.start()] + markdown[end:]
    return None, markdown


def _items(section: str) -> list[str]:
    """The list items of a markdown section, each joined onto one line."""
    items: list[str] = []
    for line in section.splitlines():
        if re.match(r"^\s*[-*]\s+", line):
            items.append(re.sub(r"^\s*[-*]\s+", "", line))
        elif line.strip() and items:
            items[-1] += " " + line.strip()
    return items


def _chunks(item: str) -> list[str]:
    """An item split into citations: at ``;`` and at ``, and the`` outside parentheses
    ("Micikevicius et al. (2022), and the Open Compute Project's *MX Specification*")."""
    chunks, depth, start = [], 0, 0
    for i, c in enumerate(item):
        depth += (c == "(") - (c == ")")
        joint = _AND_THE.match(item, i) if depth == 0 and i > start else None
        if depth == 0 and c == ";":
            chunks.append(item[start:i])
            start = i + 1
        elif joint:
            chunks.append(item[start:i])
            start = joint.end()
    chunks.append(item[start:])
    return [c.strip(" .") for c in chunks if c.strip(" .")]


def _titled(chunk: str) -> list[Citation]:
    """A document's citations: each title, with the year that follows it, if any."""
    titles = [
        (m.start(), m.end(), next(g for g in m.groups() if g)) for m in _TITLE.finditer(chunk)
    ]
    if not titles:
        titles = [(m.start(), m.end(), m.group(1)) for m in _CODE.finditer(chunk)]
    out = []
    for n, (_, end, title) in enumerate(titles):
        stop = titles[n + 1][0] if n + 1 < len(titles) else len(chunk)
        year = re.search(_YEAR, chunk[end:stop])
        out.append(Citation(None, year.group(0) if year else None, title.strip(), chunk))
    return out


def chunk_citations(chunk: str) -> list[Citation]:
    """The citations of one Further-reading chunk (a work, documents, or a named thing)."""
    kit_links = [t for _, t in _LINK.findall(chunk) if not re.match(r"^[a-z]+:", t)]
    bare = _LINK.sub(lambda m: m.group(1), chunk)
    if kit_links and not (_TITLE.search(bare) or re.search(_YEAR, bare)):
        return []  # a pointer to another page of the kit, with its description
    lead = _LEAD_AUTHORS.match(bare)
    if lead:
        authors = lead.group("authors")
        person = bool(lead.group("etal") or " and " in authors or "," in authors
                      or re.match(_INITIALS, authors))  # fmt: skip
        year = re.search(_YEAR, bare[lead.end() :])
        if person and year:
            return [Citation(_surname(authors), year.group(0), None, chunk)]
    titled = _titled(bare)
    if titled:
        return titled
    phrase = re.split(r"[:,(]", bare, maxsplit=1)[0].strip(" .")
    year = re.search(_YEAR, bare)
    return [Citation(None, year.group(0) if year else None, phrase, chunk)] if phrase else []


def reading_citations(section: str) -> list[Citation]:
    """The citations of a Further reading section: every chunk of every list item."""
    return [
        c for item in _items(section) for chunk in _chunks(item) for c in chunk_citations(chunk)
    ]


# ---------------------------------------------------------------- notebooks


def section_of(path: str) -> str | None:
    """The reading-list section a notebook's citations belong to: ``course/01-...`` and
    ``course/appendix/02-...`` -> "Lecture 01" and "Lecture 02", ``labs/lab03-...`` ->
    "Lab 03", ``project/README.md`` -> "Project"; None for anything else."""
    p = Path(path)
    if p.parts[0] == "course" and re.match(r"\d\d-", p.name):
        return f"Lecture {p.name[:2]}"
    m = re.match(r"lab(\d\d)-", p.name)
    if p.parts[0] == "labs" and m:
        return f"Lab {m.group(1)}"
    return "Project" if p.parts[0] == "project" else None


def markdown_of(file: Path) -> list[str]:
    """A notebook's markdown cells (from its JSON), or a markdown file as one cell."""
    if file.suffix != ".ipynb":
        return [file.read_text(encoding="utf-8")]
    cells = json.loads(file.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c.get("cell_type") == "markdown"]


def notebook_citations(root: Path, path: str) -> list[Citation]:
    """Every citation of the notebook at ``root / path``: Further reading and prose."""
    where = section_of(path) or path
    found: list[Citation] = []
    for cell in markdown_of(root / path):
        reading, prose = split_further_reading(cell)
        found += reading_citations(reading) if reading is not None else []
        found += prose_citations(prose)
    seen, unique = set(), []
    for c in found:
        if (c.author, c.year, c.title) not in seen:
            seen.add((c.author, c.year, c.title))
            unique.append(Citation(c.author, c.year, c.title, c.text, where, path))
    return unique


def course_sources(root: Path) -> list[str]:
    """The files whose citations the reading list must hold: lectures (and their
    appendices), the learners' labs, and the project brief."""
    files = [*sorted(root.glob("course/[0-9][0-9]-*.ipynb")),
             *sorted(root.glob("course/appendix/[0-9][0-9]-*.ipynb")),
             *sorted(root.glob("labs/lab[0-9][0-9]-*.ipynb")), root / "project" / "README.md"]  # fmt: skip
    return [f.relative_to(root).as_posix() for f in files if f.is_file()]


# ---------------------------------------------------------------- the reading list


def reading_list_sections(markdown: str) -> dict[str, list[str]]:
    """The entries (list items) of the reading list under each ``## Lecture NN`` /
    ``## Lab NN`` / ``## Project`` heading, keyed "Lecture 01", "Lab 02", "Project"."""
    sections: dict[str, list[str]] = {}
    parts = re.split(r"^##\s+(.*)$", markdown, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2]):
        m = re.match(r"(Lecture|Lab)\s+0?(\d+)\b|(Project)\b", heading.strip())
        if m:
            key = m.group(3) or f"{m.group(1)} {int(m.group(2)):02d}"
            sections.setdefault(key, []).extend(_items(body))
    return sections


def leads_with(entry: str, author: str) -> bool:
    """Whether ``entry`` starts with ``author`` as its first author (initials allowed
    before it): ``S. Rajbhandari, J. Rasley, ...`` leads with Rajbhandari, not Rasley."""
    pattern = rf"(?:[a-z]\.\s?)*{re.escape(normalise(author))}(?![\w])"
    return re.match(pattern, normalise(entry)) is not None


def lists(entry: str, citation: Citation) -> bool:
    """Whether one reading-list entry lists ``citation``: it leads with the citation's
    first author, or contains its title, and it contains the year."""
    if citation.author and not leads_with(entry, citation.author):
        return False
    return all(contains(entry, n) for n in citation.needles)


def unlisted(citations: Iterable[Citation], sections: dict[str, list[str]]) -> list[str]:
    """One message per citation that no entry of its section lists, saying what to add
    where. A lab's or the project's citation also counts as listed under any lecture."""
    lectures = [e for k, v in sections.items() if k.startswith("Lecture") for e in v]
    problems = []
    for c in citations:
        entries = sections.get(c.where, [])
        if not c.where.startswith("Lecture"):
            entries = entries + lectures
        if any(lists(e, c) for e in entries):
            continue
        want = " and ".join(f"'{n}'" for n in c.needles)
        problems.append(
            f"{c.source} cites {c.key!r} (from: {c.text.strip()[:120]!r}), but "
            f"{READING_LIST.as_posix()} has no entry for it under '## {c.where}': add a list "
            f"item there that contains {want}, with a link and one sentence on what to read it for"
        )
    return problems


def check_reading_list(root: Path, reading_list: str | None = None) -> list[str]:
    """Every unlisted citation of the course, as messages (empty: the list is complete).
    ``reading_list`` replaces the file's text (tests pass an edited copy)."""
    text = (
        (root / READING_LIST).read_text(encoding="utf-8") if reading_list is None else reading_list
    )
    sections = reading_list_sections(text)
    return unlisted(
        [c for p in course_sources(root) for c in notebook_citations(root, p)], sections
    )


__all__ = ["NOT_AUTHORS", "READING_LIST", "Citation", "check_reading_list", "chunk_citations",
           "contains", "course_sources", "leads_with", "lists", "markdown_of", "normalise", "notebook_citations",
           "prose_citations", "reading_citations", "reading_list_sections", "section_of",
           "split_further_reading", "unlisted"]  # fmt: skip
