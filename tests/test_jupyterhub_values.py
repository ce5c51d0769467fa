"""deploy/jupyterhub/values.yaml: valid for the zero-to-jupyterhub chart, as Helm checks it.

Helm merges the values a user passes over the chart's own values.yaml (a key set to null
removes the chart's key; lists are replaced, maps merged key by key) and validates the
result against the chart's values.schema (JSON Schema draft-07) before rendering. The
chart's two files are copied unchanged into tests/data/zero-to-jupyterhub/ (their source
and sha256 in PROVENANCE.json), so the test runs without ../shared, and equals a fresh
copy whenever ../shared is there. The profiles, which the chart's schema leaves
unchecked, are checked here against KubeSpawner's names; the sizes against the labs'
measured peaks (docs/lab-memory-2core.json). Under a second.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator

from ddtk.course.hub import nbgitpuller_link

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "deploy" / "jupyterhub" / "values.yaml"
README = ROOT / "deploy" / "jupyterhub" / "README.md"
CHART = ROOT / "tests" / "data" / "zero-to-jupyterhub"
SHARED_CHART = ROOT.parent / "shared" / "charts" / "zero-to-jupyterhub"
LAB_PEAKS = ROOT / "docs" / "lab-memory-2core.json"

# What a profileList entry may hold, and the KubeSpawner traits a kubespawner_override may
# set here (names from KubeSpawner's spawner.py; the chart's schema types profileList as
# a bare array, so without this a misspelt key would pass and be ignored at spawn time).
PROFILE_KEYS = {"display_name", "slug", "description", "default", "kubespawner_override", "profile_options"}
KUBESPAWNER_OVERRIDES = {
    "image", "cpu_guarantee", "cpu_limit", "mem_guarantee", "mem_limit",
    "extra_resource_guarantees", "extra_resource_limits", "tolerations", "node_selector",
    "environment", "volumes", "volume_mounts", "image_pull_policy",
}  # fmt: skip
BYTE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # KubeSpawner's ByteSpecification
QUANTITY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
RAY_OBJECT_STORE_SHARE = 0.3  # Ray's object store defaults to 30 % of the memory it sees
RAY_MEMORY_MONITOR = 0.95  # Ray kills tasks above this share of the memory limit


def helm_merge(chart: Any, user: Any) -> Any:
    """Helm's coalescing of user values over a chart's: maps merged key by key, the user's
    value winning; a user's null deletes the key; anything else (lists too) replaced."""
    if not (isinstance(chart, dict) and isinstance(user, dict)):
        return copy.deepcopy(user)
    merged = copy.deepcopy(chart)
    for key, value in user.items():
        if value is None:
            merged.pop(key, None)
        elif key in merged:
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@functools.cache
def _chart(chart: Path) -> tuple[Draft7Validator, dict[str, Any]]:
    """The chart's schema (as a validator) and its default values, read once."""
    schema = yaml.safe_load((chart / "values.schema.yaml").read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema), yaml.safe_load((chart / "values.yaml").read_text())


def schema_errors(values: dict[str, Any], chart: Path = CHART) -> list[str]:
    """``path: message`` for each way ``values`` merged over the chart's fails its schema."""
    validator, defaults = _chart(chart)
    merged = helm_merge(defaults, values)
    return sorted(
        f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in validator.iter_errors(merged)
    )


def byte_size(spec: str | int) -> int:
    """KubeSpawner's memory ``6G`` (binary units) or a Kubernetes quantity ``8Gi``, in bytes."""
    if isinstance(spec, int):
        return spec
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?", str(spec))
    if not m:
        raise ValueError(f"not a memory size: {spec!r}")
    unit = m.group(2) or ""
    return int(float(m.group(1)) * (QUANTITY_UNITS.get(unit) or BYTE_UNITS.get(unit, 1)))


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def profiles(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each profile's effective settings: singleuser's, then its kubespawner_override."""
    su = values["singleuser"]
    base = {
        "cpu_guarantee": su["cpu"]["guarantee"], "cpu_limit": su["cpu"]["limit"],
        "mem_guarantee": su["memory"]["guarantee"], "mem_limit": su["memory"]["limit"],
        "image": f"{su['image']['name']}:{su['image']['tag']}",
    }  # fmt: skip
    return {p["slug"]: {**base, **p.get("kubespawner_override", {})} for p in su["profileList"]}


# ------------------------------------------------------------------ the chart's copy


def test_chart_copy_is_what_provenance_says() -> None:
    provenance = json.loads((CHART / "PROVENANCE.json").read_text())
    assert provenance["source"] == "../shared/charts/zero-to-jupyterhub/"
    for name, digest in provenance["sha256"].items():
        assert hashlib.sha256((CHART / name).read_bytes()).hexdigest() == digest, name
    assert sorted(p.name for p in CHART.iterdir()) == sorted([*provenance["sha256"], "PROVENANCE.json"])


@pytest.mark.skipif(not SHARED_CHART.is_dir(), reason=f"the chart's files are not at {SHARED_CHART}")
def test_chart_copy_equals_the_shared_chart() -> None:
    for name in ("values.schema.yaml", "values.yaml", "LICENSE"):
        assert (CHART / name).read_bytes() == (SHARED_CHART / name).read_bytes(), (
            f"tests/data/zero-to-jupyterhub/{name} differs from ../shared: copy it again and "
            "update PROVENANCE.json"
        )


# ------------------------------------------------------------------ the schema, as Helm applies it


def test_values_validate_against_the_chart_schema(values: dict[str, Any]) -> None:
    assert schema_errors(values) == []


def test_the_values_alone_are_not_what_helm_validates(values: dict[str, Any]) -> None:
    """Validated without the chart's defaults, the values miss the schema's required keys:
    the merge is what makes the check Helm's."""
    validator, _ = _chart(CHART)
    messages = [e.message for e in validator.iter_errors(values)]
    assert "'imagePullSecrets' is a required property" in messages


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("singleuser", "memroy"), {"limit": "8G"},
         "singleuser: Additional properties are not allowed ('memroy' was unexpected)"),
        (("singleuser", "cpu", "limit"), "four", "singleuser.cpu.limit: 'four' is not of type 'number', 'null'"),
        (("singleuser", "storage", "type"), "persistent",
         "singleuser.storage.type: 'persistent' is not one of ['dynamic', 'static', 'none']"),
        (("singleuser", "storage", "homeMountPath"), None,
         "singleuser.storage: 'homeMountPath' is a required property"),
        (("cull", "timeout"), "1h", "cull.timeout: '1h' is not of type 'integer', 'null'"),
    ],
)  # fmt: skip
def test_a_mistake_fails_the_schema(
    values: dict[str, Any], path: tuple[str, ...], value: Any, expected: str
) -> None:
    broken = copy.deepcopy(values)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert expected in schema_errors(broken)


def test_helm_merge() -> None:
    chart = {"a": {"b": 1, "c": [1, 2], "d": "x"}, "e": None}
    user = {"a": {"b": 2, "c": [3], "d": None}, "f": {"g": 1}}
    assert helm_merge(chart, user) == {"a": {"b": 2, "c": [3]}, "e": None, "f": {"g": 1}}
    assert chart == {"a": {"b": 1, "c": [1, 2], "d": "x"}, "e": None}  # inputs untouched


# ------------------------------------------------------------------ what the values must do for the class


def test_cpu_and_gpu_profiles(values: dict[str, Any]) -> None:
    entries = values["singleuser"]["profileList"]
    for entry in entries:
        assert set(entry) <= PROFILE_KEYS, set(entry) - PROFILE_KEYS
        override = entry.get("kubespawner_override", {})
        assert set(override) <= KUBESPAWNER_OVERRIDES, set(override) - KUBESPAWNER_OVERRIDES
    assert [e.get("default", False) for e in entries].count(True) == 1
    by_slug = profiles(values)
    assert set(by_slug) == {"cpu", "gpu"}
    assert by_slug["cpu"]["image"].startswith("ddtk-learner:") and not by_slug["cpu"]["image"].endswith("-gpu")
    assert by_slug["gpu"]["image"].endswith("-gpu")
    assert by_slug["gpu"]["extra_resource_limits"] == {"nvidia.com/gpu": "1"}
    assert "nvidia.com/gpu" not in json.dumps(by_slug["cpu"])
    for p in by_slug.values():
        assert p["cpu_guarantee"] <= p["cpu_limit"]
        assert byte_size(p["mem_guarantee"]) <= byte_size(p["mem_limit"])


def test_dev_shm_is_memory_backed_and_fits_rays_object_store(values: dict[str, Any]) -> None:
    storage = values["singleuser"]["storage"]
    [mount] = [m for m in storage["extraVolumeMounts"] if m["mountPath"] == "/dev/shm"]
    [volume] = [v for v in storage["extraVolumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    shm = byte_size(volume["emptyDir"]["sizeLimit"])
    for slug, p in profiles(values).items():
        need = RAY_OBJECT_STORE_SHARE * byte_size(p["mem_limit"])
        assert shm >= need, f"{slug}: /dev/shm {shm / 2**30:.1f} GiB < Ray's object store {need / 2**30:.1f} GiB"


def test_memory_fits_the_measured_labs(values: dict[str, Any]) -> None:
    """Each lab's measured peak (its whole process tree, PSS plus /dev/shm) fits the CPU
    server's guarantee, and stays below the share of the limit where Ray stops tasks."""
    measured = json.loads(LAB_PEAKS.read_text())
    labs = measured["labs"]
    every_lab = {p.relative_to(ROOT).as_posix() for p in (ROOT / "solutions").glob("lab*.ipynb")}
    assert {lab["notebook"] for lab in labs} == every_lab
    cpu = profiles(values)["cpu"]
    guarantee, limit = byte_size(cpu["mem_guarantee"]), byte_size(cpu["mem_limit"])
    for lab in labs:
        assert lab["returncode"] == 0, f"{lab['notebook']} failed while measured"
        peak = lab["pss_plus_shm_bytes"]
        assert peak <= guarantee, f"{lab['notebook']} peaked at {peak / 2**30:.2f} GiB > guarantee"
        assert peak <= RAY_MEMORY_MONITOR * limit, lab["notebook"]


def test_persistent_home_culler_and_first_start(values: dict[str, Any]) -> None:
    storage = values["singleuser"]["storage"]
    assert storage["type"] == "dynamic" and storage["homeMountPath"] == "/home/jovyan"
    assert byte_size(storage["capacity"]) >= 2**30
    cull = values["cull"]
    assert cull["enabled"] and 0 < cull["every"] < cull["timeout"] <= cull["maxAge"]
    assert values["singleuser"]["startTimeout"] > 300  # the chart's default misses a cold pull


def test_readme_link_is_the_one_ddtk_makes() -> None:
    """The nbgitpuller link README.md shows is what `ddtk course pull-link` prints."""
    text = README.read_text()
    m = re.search(r"ddtk course pull-link --hub (\S+) --repo (\S+)\n.*?\n(https://\S+git-pull\?\S+)", text, re.S)
    assert m, "README.md shows no `ddtk course pull-link` with its link"
    hub, repo, link = m.groups()
    assert nbgitpuller_link(hub, repo) == link
