"""Course notebooks with non-default parameters, through papermill as ``ddtk course run`` does.

Every notebook also runs with its defaults under ``pytest --nbval-lax`` (``make test``);
this module checks that the parameters really scale the same notebook.
"""

from __future__ import annotations

import json

import pytest

from ddtk.course import catalog
from ddtk.course.run import run_notebook

pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def test_lecture_01_runs_with_three_ranks(tmp_path) -> None:
    nb = catalog.find("01")
    result = run_notebook(nb.file, {"world_size": 3}, out_dir=tmp_path, timeout=300)
    assert result.ok, result.failure.describe() if result.failure else result.status
    executed = json.loads(result.output.read_text())
    text = "".join(
        "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
        for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
    )  # fmt: skip
    assert "world_size = 3" in "".join("".join(c["source"]) for c in executed["cells"])
    assert "[rank 2]" in text or "rank 2" in text
