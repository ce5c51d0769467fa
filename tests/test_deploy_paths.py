"""Every ``deploy/...`` path that a notebook or README names exists.

The notebooks (``course/``, ``solutions/``, ``labs/``), the top-level README.md and the
READMEs under ``deploy/`` point learners at manifests and scripts by path; a renamed or
missing file would send them to nothing. Paths with a ``*`` must match at least one file.
Text only, no kernel: well under a second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w/.-])deploy/[\w.*/-]*")


def documents() -> list[Path]:
    """The files whose text may name deploy/ paths."""
    notebooks = [
        p for folder in ("course", "solutions", "labs") for p in (ROOT / folder).glob("*.ipynb")
    ]
    readmes = [
        ROOT / "README.md",
        ROOT / "deploy" / "README.md",
        *(ROOT / "deploy").glob("*/README.md"),
    ]
    return sorted(p for p in notebooks + readmes if p.exists())


def text_of(path: Path) -> str:
    """A notebook's cell sources (code and markdown), or a file's whole text."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix != ".ipynb":
        return raw
    return "\n".join("".join(c["source"]) for c in json.loads(raw)["cells"])


def mentioned_paths(text: str) -> set[str]:
    """``deploy/...`` paths in ``text``, without sentence punctuation after them."""
    return {m.group(0).rstrip(".") for m in PATH.finditer(text)}


def exists(mention: str) -> bool:
    if "*" in mention:
        return any(ROOT.glob(mention))
    return (ROOT / mention).exists()


def test_the_pattern_on_a_sample() -> None:
    text = "Apply deploy/kuberay/raycluster.yaml. Then `deploy/slurm/*.sbatch`, see ../deploy/x"
    assert mentioned_paths(text) == {"deploy/kuberay/raycluster.yaml", "deploy/slurm/*.sbatch"}
    assert exists("deploy/slurm/*.sbatch") and not exists("deploy/kuberay/no-such.yaml")


def test_every_mentioned_deploy_path_exists() -> None:
    docs = documents()
    assert any(p.suffix == ".ipynb" for p in docs) and ROOT / "README.md" in docs
    missing = [
        f"{path.relative_to(ROOT).as_posix()}: {mention}"
        for path in docs
        for mention in sorted(mentioned_paths(text_of(path)))
        if not exists(mention)
    ]
    assert not missing, "deploy/ paths that do not exist:\n" + "\n".join(missing)
