"""nbgitpuller links: one click on a JupyterHub pulls the class release into a learner's home.

nbgitpuller (https://nbgitpuller.readthedocs.io, the JupyterHub project's tool) serves
``<hub>/hub/user-redirect/git-pull?repo=...&branch=...&urlpath=...``: the learner's
server clones the repository (or merges the new commits into their copy, keeping their
changes), then opens ``urlpath``. The clone lands in a folder named after the repository
unless ``targetpath`` says otherwise.

>>> nbgitpuller_link("https://hub.example.edu", "https://github.com/acme/dtas-2027.git")
'https://hub.example.edu/hub/user-redirect/git-pull?repo=https%3A%2F%2Fgithub.com%2Facme%2Fdtas-2027.git&branch=main&urlpath=lab%2Ftree%2Fdtas-2027%2Fcourse%2F01-distributed-fundamentals.ipynb'
"""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

FIRST_NOTEBOOK = "course/01-distributed-fundamentals.ipynb"


def _check_url(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ssh", "git") or not parts.netloc:
        raise ValueError(f"{what} must be a full URL such as https://..., got {url!r}")
    return url.rstrip("/")


def nbgitpuller_link(
    hub: str, repo: str, *, branch: str = "main", path: str = FIRST_NOTEBOOK,
    target: str | None = None,
) -> str:  # fmt: skip
    """The link that pulls ``repo`` (its ``branch``) into a learner's server on ``hub`` and
    opens ``path`` (relative to the repository) in JupyterLab; ``target``: the folder in
    the learner's home (default: the repository's name)."""
    hub = _check_url(hub, "the hub")
    repo = _check_url(repo, "the repository")
    if not branch.strip():
        raise ValueError("the branch needs a name")
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"the path to open is relative to the repository, got {path!r}")
    folder = target or urlsplit(repo).path.rstrip("/").split("/")[-1].removesuffix(".git")
    query = {"repo": repo, "branch": branch, "urlpath": f"lab/tree/{folder}/{path}"}
    if target:
        query["targetpath"] = target
    return f"{hub}/hub/user-redirect/git-pull?{urlencode(query)}"


__all__ = ["FIRST_NOTEBOOK", "nbgitpuller_link"]
