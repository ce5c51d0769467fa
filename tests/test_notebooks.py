"""Course notebooks with non-default parameters, through papermill as ``ddtk course run`` does.

Every notebook also runs with its defaults under ``pytest --nbval-lax`` (``make test``);
this module checks that the parameters really scale the same notebook.
"""

from __future__ import annotations

import json
import time

import pytest
from support import assert_no_ray_daemons_left, executed_text, import_or_require

from ddtk.course import catalog
from ddtk.course.run import run_notebook

pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def test_lecture_01_runs_with_three_ranks(tmp_path) -> None:
    nb = catalog.find("01")
    result = run_notebook(nb.file, {"world_size": 3}, out_dir=tmp_path, timeout=300)
    assert result.ok, result.failure.describe() if result.failure else result.status
    text = executed_text(result.output)
    executed = json.loads(result.output.read_text())
    assert "world_size = 3" in "".join("".join(c["source"]) for c in executed["cells"])
    assert "[rank 2]" in text or "rank 2" in text


def test_lecture_05_runs_with_three_ranks_and_fp16(tmp_path) -> None:
    nb = catalog.find("05")
    small = {"world_size": 3, "dtype": "fp16", "epochs": 1, "scaler_steps": 20,
             "bench_steps": 4, "matmul_sizes": [128], "batch_sizes": [16, 256]}  # fmt: skip
    result = run_notebook(nb.file, small, out_dir=tmp_path, timeout=300)
    assert result.ok, result.failure.describe() if result.failure else result.status
    text = executed_text(result.output)
    assert "autocast dtype=fp16" in text
    assert "scales equal at every step: True" in text
    assert "rank 2: skipped" in text  # the distributed demo ran on three ranks
    assert "fp16 autocast + loss scaler" in text


LECTURE_02_SMALL = {
    "overhead_calls": 50, "putget_sizes_kib": [4, 1024], "batch_tasks": 4, "ps_steps": 5,
    "data_repeat": 1, "data_epochs": 1, "train_epochs": 1, "allreduce_floats": [16384],
    "tune_samples": 3, "tune_max_iter": 3, "pbt_population": 2, "pbt_iters": 2, "pbt_interval": 1,
    "optuna_processes": 2, "optuna_trials_per_process": 2,
}  # fmt: skip


@pytest.mark.ray
def test_lecture_02_attaches_to_a_running_cluster(tmp_path) -> None:
    """``ray_address`` set, as on a real cluster: the notebook starts no cluster of its own,
    uses the nodes it finds (the second one advertises ``ddtk_node2``), and at the end only
    disconnects, leaving the cluster it did not start running."""
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
        result = run_notebook(catalog.find("02").file, params, out_dir=tmp_path, timeout=300)
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
