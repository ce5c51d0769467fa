"""Course notebooks with non-default parameters, through papermill as ``ddtk course run`` does.

Every notebook also runs with its defaults under ``pytest --nbval-lax`` (``make test``);
this module checks that the parameters really reach the same notebook: lecture 02
attached to a running Ray cluster, and lecture 04's shape. Lectures 01 and 05 with three
ranks are in ``tests/test_notebook_ranks.py``, outside the Ray group.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from support import assert_no_ray_daemons_left, executed_text, import_or_require

from ddtk.course import catalog
from ddtk.course.run import run_notebook

pytestmark = [pytest.mark.notebook, pytest.mark.slow]


LECTURE_02_SMALL = {
    "overhead_calls": 50, "putget_sizes_kib": [4, 1024], "batch_tasks": 4, "ps_steps": 5,
    "data_repeat": 1, "data_epochs": 1, "train_epochs": 1, "allreduce_floats": [16384],
    "tune_samples": 3, "tune_max_iter": 3, "pbt_population": 2, "pbt_iters": 2, "pbt_interval": 1,
}  # fmt: skip
# Cells the attached run leaves out: measurements and exercises that use the cluster as any
# cluster (nbval runs them at the defaults). What stays is what depends on how the cluster
# was reached and what it holds: the connection, its processes and nodes, actors (section
# 2's parameter server, which also loads the data later cells use), resources and placement
# groups, Ray Data, Ray Train, Tune searches, the troubleshooting demos, and the cleanup.
LECTURE_02_NOT_ATTACHED = frozenset({
    "code-arch_fig", "code-overhead", "code-zerocopy", "code-putget", "code-batch",
    "code-train_fig", "code-ex_asha", "code-ex_asha-answer", "code-check_asha", "code-pbt",
    "code-ex_pbt", "code-ex_pbt-answer", "code-check_pbt",
    "code-concurrency", "code-ex_concurrency", "code-ex_concurrency-answer",
    "code-check_concurrency", "code-kuberay", "code-validate",
})  # fmt: skip


def without_cells(path: Path, skip: frozenset[str], dest: Path) -> Path:
    """A copy of notebook ``path`` in ``dest`` without the code cells whose ids are in ``skip``.

    ``dest`` must be inside the repository: a lecture finds its root from its working
    directory, which is the notebook's folder."""
    nb = json.loads(path.read_text())
    ids = {c.get("id") for c in nb["cells"]}
    assert skip <= ids, f"no longer in {path.name}: {sorted(skip - ids)}"
    nb["cells"] = [c for c in nb["cells"] if c.get("id") not in skip]
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / path.name
    out.write_text(json.dumps(nb))
    return out


def build_dir() -> Path:
    """The repository's ``build/`` (ignored by git), made if missing."""
    build = Path(__file__).resolve().parents[1] / "build"
    build.mkdir(exist_ok=True)
    return build


@pytest.mark.ray
def test_lecture_02_attaches_to_a_running_cluster(tmp_path) -> None:
    """``ray_address`` set, as on a real cluster: the notebook starts no cluster of its own,
    uses the nodes it finds (the second one advertises ``ddtk_node2``), and at the end only
    disconnects, leaving the cluster it did not start running. The cells that do not depend
    on how the cluster was reached are left out (``LECTURE_02_NOT_ATTACHED``)."""
    Cluster = import_or_require("ray.cluster_utils", "ray").Cluster
    since = time.time()
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 2, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=2, resources={"ddtk_node2": 1})
        cluster.wait_for_nodes()
        gcs = cluster.head_node.all_processes["gcs_server"][0].process
        # Attaching is what this run tests; the demos' budgets are cut (nbval runs the defaults).
        params = {"ray_address": cluster.address, **LECTURE_02_SMALL}
        with tempfile.TemporaryDirectory(dir=build_dir(), prefix="attached-") as inside:
            nb = without_cells(catalog.find("02").file, LECTURE_02_NOT_ATTACHED, Path(inside))
            result = run_notebook(nb, params, out_dir=tmp_path, timeout=300)
        still_running = gcs.poll() is None
    finally:
        cluster.shutdown()
    assert_no_ray_daemons_left(since)
    assert result.ok, result.failure.describe() if result.failure else result.status
    assert still_running, "the notebook stopped a Ray cluster that it had not started"
    text = executed_text(result.output)
    assert "attached to an existing cluster" in text
    assert "2 Ray nodes, 4 logical CPUs" in text
    assert "6 tasks asking for ddtk_node2: 0.25 ran on ['node 2']" in text
    assert "Ray processes this notebook had started: none (attached)" in text
    print(f"\nlecture 02 attached to a 2-node cluster: {result.seconds:.0f} s")


def test_lecture_04_has_the_shape_of_a_lecture() -> None:
    """COURSE.md's shape: objectives by id, the overview's topics, the closing sections, 4,500+ words."""
    import re

    cells = json.loads(catalog.find("04").file.read_text())["cells"]
    markdown = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    first = markdown[0]
    assert first.startswith("# Lecture 4") and "**After this lecture you can**" in first
    assert {"3.3", "5.1", "5.2", "5.3", "5.4", "1.2"} <= set(re.findall(r"\d\.\d", first))
    headings = [line for text in markdown for line in text.splitlines() if line.startswith("## ")]
    for topic in ("NCCL communication primitives", "InfiniBand and RDMA", "Network topology optimisation",
                  "Multi-GPU communication patterns", "Troubleshooting network bottlenecks",
                  "On a real cluster", "Summary", "Self-check", "Further reading"):  # fmt: skip
        assert any(topic in h for h in headings), topic
    prose = re.sub(r"```.*?```", "", "\n".join(markdown), flags=re.S)
    words = len(re.findall(r"[A-Za-z][\w'-]*", prose))
    assert words >= 4500, words
    assert "<details>" in markdown[-2] or any("<details>" in m for m in markdown[-3:])
