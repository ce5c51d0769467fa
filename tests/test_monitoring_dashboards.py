"""ddtk.monitoring.dashboards: the Grafana JSON is valid, committed as generated, and its PromQL parses.

Validation round-trips each dashboard through grafana-foundation-sdk's model classes and
checks every field's type; a malformed dashboard (an unknown field, a wrong type, an unknown
panel type, a query without PromQL, a panel off the grid) must fail with the path named.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from support import import_or_require

import_or_require("grafana_foundation_sdk", "monitoring")

from ddtk.monitoring import dashboards  # noqa: E402
from ddtk.monitoring.dashboards import (  # noqa: E402
    DASHBOARDS,
    DashboardError,
    check,
    legend,
    panel_queries,
    training_dashboard,
    validate,
)

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "deploy" / "monitoring" / "dashboards"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_each_dashboard_is_valid_and_committed_as_generated(name: str) -> None:
    board = DASHBOARDS[name]()
    assert validate(board) == []
    assert (COMMITTED / name).read_text() == dashboards.dump(board), (
        f"deploy/monitoring/dashboards/{name} is stale: run `python -m ddtk.monitoring.dashboards`"
    )
    uids = {json.loads((COMMITTED / n).read_text())["uid"] for n in DASHBOARDS}
    assert len(uids) == len(DASHBOARDS)


def test_the_training_dashboard_has_the_panels_the_lecture_reads() -> None:
    titles = [q.title for q in panel_queries(training_dashboard())]
    for wanted in ("Samples per second", "Step time p50 and p99 by rank", "Loss by rank",
                   "Step shares by rank (profiled window)", "Busy time per step by rank",
                   "Checkpoint age and interval", "Restarts"):  # fmt: skip
        assert wanted in titles


def _break(board: dict) -> dict:
    bad = copy.deepcopy(board)
    panels = bad["panels"]
    panels[1]["titel"] = "typo"  # an unknown field
    bad["schemaVersion"] = "41"  # a wrong type
    panels[2]["type"] = "timeseriez"  # an unknown panel type
    panels[3]["gridPos"]["w"] = 30  # off the grid
    del panels[4]["targets"][0]["expr"]  # a query without PromQL
    panels[6]["targets"][0]["legendFormat"] = 3  # a wrong type, deep down
    return bad


def test_a_malformed_dashboard_fails_naming_each_problem() -> None:
    problems = validate(_break(training_dashboard()))
    joined = "\n".join(problems)
    assert "dashboard.panels[1].titel: not a field of Grafana's model" in joined
    assert "dashboard.schema_version: expected int, got '41'" in joined
    assert "unknown panel type 'timeseriez'" in joined
    assert "does not fit Grafana's 24 columns" in joined
    assert "query A has no PromQL expr" in joined
    assert "dashboard.panels[6].targets[0].legend_format: expected str, got 3" in joined
    with pytest.raises(DashboardError, match=r"problem\(s\) in dashboard ddtk-training"):
        check(_break(training_dashboard()))
    assert validate([]) == ["dashboard: expected a JSON object, got list"]
    assert validate({"panels": "x"})[0].startswith("dashboard: Grafana's model cannot read it")


def test_panel_queries_fill_in_grafanas_variables() -> None:
    queries = panel_queries(training_dashboard(), {"job": "demo"}, rate_interval="10s")
    first = queries[0]
    assert first.title == "Samples per second" and first.unit == "short"
    assert first.expr == 'sum by (job) (rate(ddtk_samples_total{job=~"demo"}[10s]))'
    assert all("$" not in q.expr for q in queries)
    assert legend("p99 rank {{rank}}", {"rank": "1"}) == "p99 rank 1"


def test_every_dashboard_query_is_promql_that_promtool_parses(tmp_path: Path) -> None:
    """Each expression as a recording rule: ``promtool check rules`` parses its PromQL."""
    from ddtk.monitoring.alerts import check_rules
    from ddtk.monitoring.prometheus import PrometheusNotInstalled, find_binary

    try:
        find_binary("promtool")
    except PrometheusNotInstalled as exc:
        from support import require_or_skip

        require_or_skip("prometheus", str(exc))
    exprs = [q.expr for build in DASHBOARDS.values() for q in panel_queries(build())]
    rules = [{"record": f"check:q{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "queries.rules"
    path.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in check_rules(path)
