"""deploy/: every manifest validates against its operator's CRD, and runs code the package has.

The schemas come from ``scripts/crd_schemas.py`` (the upstream CRDs in ../shared/crds);
the negative cases check that a typo, a wrong type, a missing field and an unknown kind
each fail with an error that names the path in the document.
"""

from __future__ import annotations

import copy
import doctest
import hashlib
import importlib
import importlib.util
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddtk import manifests
from ddtk.manifests import check, validate, validate_file

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
SCHEMAS = DEPLOY / "schemas"
CRDS = ROOT.parent / "shared" / "crds"
CRDS_MONITORING_RDMA = ROOT.parent / "shared" / "crds-monitoring-rdma"
SCRIPT = ROOT / "scripts" / "crd_schemas.py"
# Helm values are no Kubernetes objects: tests/test_jupyterhub_values.py checks them against their chart.
HELM_VALUES = {DEPLOY / "jupyterhub" / "values.yaml"}
YAML_FILES = sorted(
    p for pattern in ("*.yaml", "*.yml") for p in DEPLOY.rglob(pattern) if p not in HELM_VALUES
)


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "kuberay" / name).read_text())


@pytest.fixture
def raycluster() -> dict[str, Any]:
    return _load("raycluster.yaml")


@pytest.fixture
def rayjob() -> dict[str, Any]:
    return _load("rayjob.yaml")


def _script() -> Any:
    """scripts/crd_schemas.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("crd_schemas", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("crd_schemas", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the manifests


def test_deploy_has_manifests() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in YAML_FILES}
    assert {"kuberay/raycluster.yaml", "kuberay/rayjob.yaml"} <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_manifest_is_valid(path: Path) -> None:
    errors = validate_file(path)
    assert not errors, "\n".join(errors)


def _argvs(node: Any) -> Iterator[list[str]]:
    """Every command line of a manifest: RayJob ``entrypoint`` strings, container command+args."""
    if isinstance(node, dict):
        if isinstance(node.get("entrypoint"), str):
            yield shlex.split(node["entrypoint"])
        if isinstance(node.get("command"), list):
            yield [str(a) for a in node["command"] + node.get("args", [])]
        for value in node.values():
            yield from _argvs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _argvs(value)


LAUNCHERS = {"torch.distributed.run"}  # `python -m torch.distributed.run [flags] -m MODULE ...`


def _modules_of(argv: list[str]) -> Iterator[tuple[str, list[str]]]:
    """``(module, arguments)`` of a ``python -m`` or ``torchrun`` command line.

    A launcher module (torchrun) yields itself with its arguments, then the module it
    starts with the arguments that module receives.
    """
    if not argv or "-m" not in argv[:-1]:
        return
    name = Path(argv[0]).name
    if name == "torchrun":
        rest = argv[1:]
        launcher = "torch.distributed.run"
    elif name.startswith("python"):
        at = argv.index("-m")
        launcher, rest = argv[at + 1], argv[at + 2 :]
        if launcher not in LAUNCHERS:
            yield launcher, rest
            return
    else:
        return
    yield launcher, rest
    if "-m" in rest[:-1]:
        at = rest.index("-m")
        yield rest[at + 1], rest[at + 2 :]


def _python_modules() -> list[tuple[str, str, list[str]]]:
    """``(file, module, arguments)`` for every ``python -m module ...`` in deploy/."""
    found = []
    for path in YAML_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            for argv in _argvs(doc):
                for module, args in _modules_of(argv):
                    found.append((path.relative_to(DEPLOY).as_posix(), module, args))
    return found


ENTRY_POINTS = _python_modules()


def test_rayjob_entrypoint_is_found() -> None:
    modules = {(f, m) for f, m, _ in ENTRY_POINTS}
    assert ("kuberay/rayjob.yaml", "ddtk.examples.ray_digits") in modules


def test_trainjob_runs_the_ddp_recipe_under_torchrun() -> None:
    modules = {(f, m) for f, m, _ in ENTRY_POINTS}
    assert ("kubeflow/ddp-trainjob.yaml", "torch.distributed.run") in modules
    assert ("kubeflow/ddp-trainjob.yaml", "ddtk.examples.cnn_ddp") in modules
    doc = yaml.safe_load((DEPLOY / "kubeflow" / "ddp-trainjob.yaml").read_text())
    assert doc["spec"]["runtimeRef"]["name"] == "torch-distributed"


def test_launcher_command_lines_are_unwrapped() -> None:
    argv = ["torchrun", "--nnodes", "2", "-m", "pkg.job", "--epochs", "3"]
    assert list(_modules_of(argv)) == [
        ("torch.distributed.run", argv[1:]),
        ("pkg.job", ["--epochs", "3"]),
    ]
    assert list(_modules_of(["python3", "-m", "pkg.job", "-x"])) == [("pkg.job", ["-x"])]
    assert list(_modules_of(["horovodrun", "-np", "4", "python", "train.py"])) == []


@pytest.mark.parametrize("where,module,args", ENTRY_POINTS, ids=lambda v: str(v)[:40])
def test_entry_point_module_exists(where: str, module: str, args: list[str]) -> None:
    assert importlib.util.find_spec(module) is not None, (
        f"{where} runs `python -m {module}`, but the package has no module {module}"
    )


@pytest.mark.slow  # importing the module may import Ray and torch: 10-25 s on 2 cores
@pytest.mark.parametrize("where,module,args", ENTRY_POINTS, ids=lambda v: str(v)[:40])
def test_entry_point_accepts_its_arguments(where: str, module: str, args: list[str]) -> None:
    """Where the module has ``parse_args(argv)``, the manifest's flags must parse."""
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"{module} does not import here ({exc})")
    if not hasattr(imported, "parse_args"):
        pytest.skip(f"{module} has no parse_args to check {args} against")
    try:
        imported.parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: `python -m {module}` rejects the arguments {args}")


# ---------------------------------------------------------------- the schemas


@pytest.mark.skipif(
    not (CRDS.is_dir() and CRDS_MONITORING_RDMA.is_dir()), reason=f"the upstream CRDs are not at {CRDS}"
)
def test_committed_schemas_equal_a_fresh_run(tmp_path: Path) -> None:
    folders = ["--crds", str(CRDS), "--crds", str(CRDS_MONITORING_RDMA)]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *folders, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_bytes() for p in SCHEMAS.iterdir()}
    assert sorted(committed) == sorted(fresh), "run `python scripts/crd_schemas.py`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"out of date: {stale}; run `python scripts/crd_schemas.py`"


def test_provenance_matches_the_schema_files() -> None:
    """Without the CRDs at hand: no schema was edited by hand, and each names its source."""
    provenance = json.loads((SCHEMAS / "PROVENANCE.json").read_text())
    assert provenance["generator"] == "scripts/crd_schemas.py"
    entries = provenance["schemas"]
    assert {p.name for p in SCHEMAS.glob("*.json")} == {*entries, "PROVENANCE.json"}
    for name, entry in entries.items():
        text = (SCHEMAS / name).read_bytes()
        assert hashlib.sha256(text).hexdigest() == entry["schema_sha256"], name
        assert name == f"{entry['group']}_{entry['version']}_{entry['kind']}.json"
        sources = ("../shared/crds/", "../shared/crds-monitoring-rdma/")
        assert entry["source"].startswith(sources) and len(entry["sha256"]) == 64
    operators = {e["operator"]: e["operator_version"] for e in entries.values()}
    assert operators == {
        "kuberay": "v1.7.0",
        "kubeflow-trainer": "v2.3.0",
        "mpi-operator": "v0.8.0",
        "prometheus-operator": "v0.93.0+24 (6adcebc5076c34f4f55f8f5f7b1e528929373ac7)",
        "network-operator": "v26.7.0-beta.5+ (b06827e085c59726b699faffcc526342d4d8e395)",
        "multus": "v4.3.0+ (95a0932350f0060cd232096876e24672a1de83fa)",
    }


@pytest.mark.slow  # checks 3.4 MB of schemas against the metaschema: about 20 s
def test_every_schema_is_valid_json_schema() -> None:
    from jsonschema import Draft202012Validator

    for path in sorted(SCHEMAS.glob("*_*.json")):
        Draft202012Validator.check_schema(json.loads(path.read_text()))


def test_conversion_rules() -> None:
    """The openAPIV3Schema extensions become the JSON Schema the API server behaves like."""
    crd_version = {
        "name": "v1",
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {
                                "anyOf": [{"type": "integer"}, {"type": "string"}],
                                "x-kubernetes-int-or-string": True,
                            },
                            "note": {"type": "string", "nullable": True},
                            "free": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                            "labels": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "inner": {
                                "type": "object",
                                "x-kubernetes-embedded-resource": True,
                                "properties": {"spec": {"type": "object"}},
                            },
                            "tags": {
                                "type": "array",
                                "items": {"type": "string"},
                                "x-kubernetes-list-type": "set",
                            },
                        },
                    }
                },
            }
        },
    }
    schema = _script().resource_schema(crd_version, "example.com", "Thing", "Thing")
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    good = {
        "apiVersion": "example.com/v1",
        "kind": "Thing",
        "metadata": {"name": "a"},
        "spec": {
            "size": "10%",
            "note": None,
            "free": {"anything": {"at": "all"}},
            "labels": {"k": "v"},
            "inner": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
            "tags": ["a", "b"],
        },
    }
    assert list(validator.iter_errors(good)) == []
    assert validator.is_valid({**good, "spec": {**good["spec"], "size": 3}})

    def invalid(change: dict[str, Any]) -> bool:
        return not validator.is_valid({**good, "spec": {**good["spec"], **change}})

    assert invalid({"size": 1.5})  # int-or-string: not a float
    assert invalid({"note": 3})
    assert invalid({"typo": 1})  # unknown field at a level with properties
    assert invalid({"inner": {"spec": {"x": 1}}})  # ... and in an object with no properties
    assert invalid({"labels": {"k": 1}})
    assert invalid({"tags": ["a", "a"]})
    assert not validator.is_valid({k: v for k, v in good.items() if k != "spec"})
    assert not validator.is_valid({**good, "apiVersion": "example.com/v2"})
    assert not validator.is_valid({**good, "metadata": {"labels": {}}})  # no name


# ---------------------------------------------------------------- errors name the path


def test_typo_in_a_field_name(raycluster: dict[str, Any]) -> None:
    group = raycluster["spec"]["workerGroupSpecs"][0]
    group["replica"] = group.pop("replicas")
    assert validate(raycluster) == [
        "spec.workerGroupSpecs[0].replica: unknown field (did you mean 'replicas'?)"
    ]


def test_typo_in_the_rayjob(rayjob: dict[str, Any]) -> None:
    rayjob["spec"]["entryPoint"] = rayjob["spec"].pop("entrypoint")
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
        "volumeMount"
    ] = []
    errors = validate(rayjob)
    assert "spec.entryPoint: unknown field (did you mean 'entrypoint'?)" in errors
    assert (
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].volumeMount: "
        "unknown field (did you mean 'volumeMounts'?)" in errors
    )


def test_integer_where_a_string_is_wanted(raycluster: dict[str, Any]) -> None:
    raycluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    (error,) = validate(raycluster)
    assert error.startswith(
        "spec.headGroupSpec.rayStartParams.num-cpus: expected string, got integer"
    )
    assert 'quote it in YAML: "0"' in error


def test_string_where_an_integer_is_wanted(raycluster: dict[str, Any]) -> None:
    raycluster["spec"]["workerGroupSpecs"][1]["maxReplicas"] = "4"
    (error,) = validate(raycluster)
    assert error.startswith("spec.workerGroupSpecs[1].maxReplicas: expected integer, got string")


def test_bad_quantity_names_its_path(raycluster: dict[str, Any]) -> None:
    container = raycluster["spec"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["memory"] = "32GB"
    assert validate(raycluster) == [
        "spec.workerGroupSpecs[1].template.spec.containers[0].resources.limits.memory: "
        "'32GB' is not a Kubernetes quantity (like 2, 500m, 8Gi)"
    ]


def test_missing_required_field(raycluster: dict[str, Any]) -> None:
    del raycluster["spec"]["headGroupSpec"]
    del raycluster["metadata"]["name"]
    assert validate(raycluster) == [
        "metadata.name: required field missing",
        "spec.headGroupSpec: required field missing",
    ]


def test_unknown_kind_and_api_version(raycluster: dict[str, Any]) -> None:
    (error,) = validate({**raycluster, "kind": "RayClustr"})
    assert error.startswith("kind: no schema for 'RayClustr' (did you mean 'RayCluster'?)")
    (error,) = validate({**raycluster, "apiVersion": "ray.io/v2"})
    assert error == "apiVersion: RayCluster has no schema for apiVersion 'ray.io/v2'; known: " + (
        "ray.io/v1, ray.io/v1alpha1"
    )
    assert validate({"kind": "RayCluster"}) == ["apiVersion: required field missing"]


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    (error,) = validate("spec: [unclosed")
    assert error.startswith("not valid YAML: line 1")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: RayCluster\n\tapiVersion: ray.io/v1\n")
    (error,) = validate_file(bad)
    assert error.startswith(f"{bad}: not valid YAML: line 2")
    assert validate("- a list") == [
        "<document>: expected a mapping with apiVersion and kind, got array"
    ]
    assert validate("a: 1\na: 2") == ["not valid YAML: line 2, column 1: duplicate key 'a'"]


def test_multi_document_file_reports_file_line_and_document(tmp_path: Path) -> None:
    text = (DEPLOY / "kuberay" / "raycluster.yaml").read_text()
    typo = text.replace("      replicas: 0\n", "      replica: 0\n", 1)
    path = tmp_path / "two.yaml"
    path.write_text(text + "---\n" + typo)
    line = (text + "---\n" + typo).splitlines().index("      replica: 0") + 1
    assert validate_file(path) == [
        f"{path}:{line}: spec.workerGroupSpecs[1].replica: unknown field "
        "(did you mean 'replicas'?) (RayCluster ddtk-raycluster)"
    ]
    errors = validate(path)
    assert errors == [
        "document 2: spec.workerGroupSpecs[1].replica: unknown field (did you mean 'replicas'?)"
    ]


def test_check_raises_with_every_error(raycluster: dict[str, Any]) -> None:
    check(copy.deepcopy(raycluster))
    raycluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    raycluster["spec"]["enableInTreeAutoscaling"] = "yes"
    with pytest.raises(ValueError) as caught:
        check(raycluster)
    message = str(caught.value)
    assert message.startswith("2 problem(s)")
    assert "spec.headGroupSpec.rayStartParams.num-cpus" in message
    assert "spec.enableInTreeAutoscaling: expected boolean, got string" in message


def test_module_docstring_examples() -> None:
    result = doctest.testmod(manifests, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_the_monitoring_manifests_are_checked_and_agree_with_the_job() -> None:
    """deploy/monitoring's PrometheusRule, PodMonitors and TrainJob are validated like the rest;
    a typo in each names its path; the PodMonitors scrape the ports the ranks listen on."""
    monitoring = DEPLOY / "monitoring"
    docs = {p.name: list(yaml.safe_load_all(p.read_text())) for p in YAML_FILES if p.parent == monitoring}
    assert {d["kind"] for ds in docs.values() for d in ds} == {"PrometheusRule", "PodMonitor", "TrainJob"}
    ray_monitor, job_monitor = docs["podmonitor.yaml"]
    endpoint = copy.deepcopy(job_monitor)["spec"]["podMetricsEndpoints"][0]
    endpoint["relabeling"] = endpoint.pop("relabelings")
    assert validate({**job_monitor, "spec": {**job_monitor["spec"], "podMetricsEndpoints": [endpoint]}}) == [
        "spec.podMetricsEndpoints[0].relabeling: unknown field (did you mean 'relabelings'?)"
    ]
    [rule] = copy.deepcopy(docs["prometheusrule.yaml"])
    rule["spec"]["groups"][0]["rules"][5]["for"] = "ten minutes"
    (error,) = validate(rule)
    assert error.startswith("spec.groups[0].rules[5].for: 'ten minutes' does not match")
    # the TrainJob's ranks listen on --metrics-port + LOCAL_RANK: one endpoint per local rank
    [job] = docs["profiled-trainjob.yaml"]
    command = job["spec"]["trainer"]["command"]
    base = int(command[command.index("--metrics-port") + 1])
    ports = [r["replacement"] for e in job_monitor["spec"]["podMetricsEndpoints"] for r in e["relabelings"]
             if r.get("targetLabel") == "__address__"]  # fmt: skip
    assert ports == [f"$1:{base + i}" for i in range(job["spec"]["trainer"]["numProcPerNode"])]
    assert job_monitor["spec"]["selector"]["matchLabels"]["jobset.sigs.k8s.io/jobset-name"] == job["metadata"]["name"]
    # the Ray workers export on the named port that the other PodMonitor scrapes
    cluster = _load("raycluster.yaml")
    for group in cluster["spec"]["workerGroupSpecs"]:
        [container] = group["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert {"name": "ddtk-metrics", "containerPort": int(env["DDTK_METRICS_PORT"])} in container["ports"]
    assert ray_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "ddtk-metrics"
