"""ddtk.monitoring.alerts: the rules, as committed, pass promtool's checks and unit tests.

- ``deploy/monitoring/`` holds exactly what the code generates (rule file and PrometheusRule);
- ``promtool check rules`` accepts the rule file, and rejects a broken rule with a message
  that names it, through :func:`check_rules`;
- ``promtool test rules`` runs ``tests/data/monitoring/ddtk-training.test.yml``: every alert
  fires on its input series and stays silent on the healthy ones (the straggler against a
  uniformly slow job among them); the same unit tests fail against a rule file whose
  straggler factor is wrong, so they can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import require_or_skip

from ddtk.manifests import validate
from ddtk.monitoring import alerts
from ddtk.monitoring.alerts import RuleCheckError, RuleParams, check_rules, unit_test_rules
from ddtk.monitoring.prometheus import PrometheusNotInstalled, find_binary

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "monitoring"
UNIT_TESTS = ROOT / "tests" / "data" / "monitoring" / "ddtk-training.test.yml"


@pytest.fixture
def promtool() -> str:
    try:
        return find_binary("promtool")
    except PrometheusNotInstalled as exc:
        require_or_skip("prometheus", str(exc))


def test_committed_rules_equal_the_generated_ones(tmp_path: Path) -> None:
    written = alerts.write_deploy(tmp_path)
    for path in written:
        assert (DEPLOY / path.name).read_text() == path.read_text(), (
            f"deploy/monitoring/{path.name} is stale: run `python -m ddtk.monitoring.alerts`"
        )


def test_the_prometheusrule_is_the_rule_file_in_a_manifest() -> None:
    manifest = yaml.safe_load((DEPLOY / "prometheusrule.yaml").read_text())
    rules = yaml.safe_load((DEPLOY / "ddtk-training.rules").read_text())
    assert manifest["spec"]["groups"] == rules["groups"]
    assert validate(manifest) == []
    names = [r.get("alert") or r["record"] for g in rules["groups"] for r in g["rules"]]
    assert {"TrainingJobHung", "TrainingStraggler", "TrainingCheckpointOverdue", "TrainingRestarting",
            "GpuXidHardware", "GpuXid", "GpuEccUncorrectable", "GpuEccCorrected"} <= set(names)  # fmt: skip
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80


def test_promtool_accepts_the_rules(promtool: str) -> None:
    out = check_rules(DEPLOY / "ddtk-training.rules")
    assert "SUCCESS: 13 rules found" in out


def test_promtool_unit_tests_pass(promtool: str) -> None:
    assert "SUCCESS" in unit_test_rules(UNIT_TESTS)


def test_the_unit_tests_catch_a_wrong_threshold(promtool: str, tmp_path: Path) -> None:
    """Rules with a straggler factor of 3 miss the 2.25x straggler: the unit tests must say so."""
    rules = tmp_path / "deploy" / "monitoring"
    rules.mkdir(parents=True)
    (rules / "ddtk-training.rules").write_text(alerts.rule_file(RuleParams(straggler_factor=3.0)))
    tests = tmp_path / "tests" / "data" / "monitoring"
    tests.mkdir(parents=True)
    (tests / UNIT_TESTS.name).write_text(UNIT_TESTS.read_text())
    with pytest.raises(RuleCheckError, match=r"(?s)FAILED.*alertname: TrainingStraggler, time: 20m"):
        unit_test_rules(tests / UNIT_TESTS.name)


def test_a_broken_rule_fails_with_promtools_message(promtool: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.rules"
    broken.write_text(
        "groups:\n- name: g\n  rules:\n"
        "  - alert: Oops\n    expr: rate(ddtk_steps_total[5m] > 1\n    for: 1m\n"
    )
    with pytest.raises(RuleCheckError) as caught:
        check_rules(broken)
    message = str(caught.value)
    assert message.startswith("promtool check rules failed (exit 1):") and "broken.rules" in message
    assert "parse error" in message and "unclosed left parenthesis" in message


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"window": "5 minutes"}, "RuleParams.window must be a Prometheus duration"),
        ({"straggler_factor": 1.0}, "straggler_factor must be > 1"),
        ({"hang_after_s": 0}, "hang_after_s must be > 0"),
    ],
)
def test_bad_parameters_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RuleParams(**changes)


def test_the_wrappers_need_files() -> None:
    with pytest.raises(ValueError, match="at least one rule file"):
        check_rules()
    with pytest.raises(ValueError, match="at least one unit-test file"):
        unit_test_rules()
