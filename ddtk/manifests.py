"""Validate Kubernetes manifests of the course's operators against their CRDs, on a laptop.

The API server checks a custom resource (a RayCluster, a RayJob, a TrainJob, an
MPIJob) against the ``openAPIV3Schema`` of its CustomResourceDefinition, and with
strict field validation it rejects a field it does not know. ``scripts/crd_schemas.py``
turns the upstream CRDs into JSON schemas under ``deploy/schemas/``; this module picks
the schema from a manifest's ``apiVersion`` and ``kind`` and reports every problem with
its path in the document, so a typo fails here rather than on the cluster.

>>> validate('''
... apiVersion: ray.io/v1
... kind: RayCluster
... metadata: {name: demo}
... spec:
...   headGroupSpec:
...     rayStartParams: {num-cpus: 0}
...     template: {spec: {containers: [{name: ray-head, image: rayproject/ray:2.60.0-py311}]}}
...   workerGroupSpecs:
...   - {groupName: cpu, replica: 2, minReplicas: 0, maxReplicas: 4,
...      template: {spec: {containers: [{name: ray-worker, image: rayproject/ray:2.60.0-py311}]}}}
... ''')  # doctest: +NORMALIZE_WHITESPACE
['spec.headGroupSpec.rayStartParams.num-cpus: expected string, got integer 0
  (quote it in YAML: "0")',
 "spec.workerGroupSpecs[0].replica: unknown field (did you mean 'replicas'?)"]
>>> validate({"apiVersion": "ray.io/v1", "kind": "RayClustr", "metadata": {"name": "x"}})
... # doctest: +NORMALIZE_WHITESPACE
["kind: no schema for 'RayClustr' (did you mean 'RayCluster'?); schemas here:
  ClusterTrainingRuntime, HostDeviceNetwork, MPIJob, MacvlanNetwork,
  NetworkAttachmentDefinition, NicClusterPolicy, PodMonitor, PrometheusRule, RayCluster,
  RayJob, RayService, ServiceMonitor, SriovNetwork, SriovNetworkNodePolicy, TrainJob,
  TrainingRuntime"]

``validate_file`` reads every document of a YAML file and adds the file and line;
``check`` raises ``ValueError`` listing every error. From a shell::

    python -m ddtk.manifests deploy/kuberay/*.yaml

Not checked here (the API server still checks them): CEL rules
(``x-kubernetes-validations``), key uniqueness of map-type lists, int32 ranges, and
kinds without a schema in ``deploy/schemas`` (core objects such as a PersistentVolumeClaim).
"""

from __future__ import annotations

import difflib
import functools
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = REPO_ROOT / "deploy" / "schemas"
PROVENANCE = "PROVENANCE.json"

__all__ = ["SCHEMA_DIR", "check", "known_kinds", "load_documents", "validate", "validate_file"]

DocPath = tuple[str | int, ...]  # a location in a document: ("spec", "workerGroupSpecs", 0)
QUANTITY_MARK = "([KMGTPE]i)"  # in the pattern of every resource.Quantity field
JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


# ---------------------------------------------------------------- reading YAML


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps dates as strings and refuses duplicate keys, as kubectl does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# An unquoted 2024-01-01 reaches the API server as a string, not a date.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class Document:
    """One YAML document: its data, its index in the file (from 1) and its node tree for lines."""

    def __init__(self, data: Any, index: int, node: yaml.Node | None = None) -> None:
        self.data = data
        self.index = index
        self.node = node

    def line(self, path: DocPath) -> int | None:
        """The 1-based line of ``path``, or of its nearest ancestor present in the YAML text."""
        node = self.node
        if node is None:
            return None
        line = node.start_mark.line + 1
        for step in path:
            node, line = _child(node, step, line)
            if node is None:
                break
        return line

    def label(self) -> str:
        """``RayCluster demo`` for messages, or ``document N`` when there is no kind or name."""
        if isinstance(self.data, dict):
            kind, meta = self.data.get("kind"), self.data.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            if isinstance(kind, str) and isinstance(name, str):
                return f"{kind} {name}"
        return f"document {self.index}"


def _child(node: yaml.Node, step: str | int, line: int) -> tuple[yaml.Node | None, int]:
    """The node under ``node`` at ``step`` and the line to report for it."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(step):
                return value, key.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
        child = node.value[step]
        return child, child.start_mark.line + 1
    return None, line


def load_documents(text: str) -> list[Document]:
    """Parse every non-empty document of a YAML text; raise ValueError naming the line if bad."""
    loader = _Loader(text)
    documents = []
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            index += 1
            data = loader.construct_document(node)
            if data is not None:
                documents.append(Document(data, index, node))
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {_yaml_problem(exc)}") from None
    finally:
        loader.dispose()
    return documents


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


# ---------------------------------------------------------------- choosing a schema


def known_kinds(schemas: Path | None = None) -> dict[str, list[str]]:
    """Every kind with a schema here, and the apiVersions it has: ``{"RayCluster": ["ray.io/v1", ...]}``."""
    kinds: dict[str, list[str]] = {}
    for entry in _provenance(schemas or SCHEMA_DIR).values():
        kinds.setdefault(entry["kind"], []).append(f"{entry['group']}/{entry['version']}")
    return {kind: sorted(versions) for kind, versions in sorted(kinds.items())}


@functools.cache
def _provenance(schemas: Path) -> dict[str, Any]:
    path = schemas / PROVENANCE
    if not path.is_file():
        raise FileNotFoundError(
            f"no manifest schemas at {schemas}: run `python scripts/crd_schemas.py` in a checkout "
            "of the course repository"
        )
    return json.loads(path.read_text())["schemas"]


@functools.cache
def _validator(path: Path) -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(path.read_text()))


def _schema_for(data: dict[str, Any], schemas: Path) -> tuple[Any, list[tuple[DocPath, str]]]:
    """The validator for a manifest's apiVersion and kind, or the errors saying why there is none."""
    api_version, kind = data.get("apiVersion"), data.get("kind")
    problems: list[tuple[DocPath, str]] = []
    for field, value in (("apiVersion", api_version), ("kind", kind)):
        if value is None:
            problems.append(((field,), "required field missing"))
        elif not isinstance(value, str):
            problems.append(((field,), f"expected string, got {_json_type(value)}"))
    if problems:
        return None, problems
    group, _, version = api_version.rpartition("/")
    name = f"{group}_{version}_{kind}.json"
    if group and name in _provenance(schemas):
        return _validator(schemas / name), []
    return None, [_unknown_kind(api_version, kind, schemas)]


def _unknown_kind(api_version: str, kind: str, schemas: Path) -> tuple[DocPath, str]:
    kinds = known_kinds(schemas)
    if kind in kinds:
        served = ", ".join(kinds[kind])
        message = f"{kind} has no schema for apiVersion {api_version!r}; known: {served}"
        return ("apiVersion",), message
    hint = _did_you_mean(kind, kinds)
    return ("kind",), f"no schema for {kind!r}{hint}; schemas here: {', '.join(kinds)}"


# ---------------------------------------------------------------- describing errors


def _json_type(value: Any) -> str:
    return JSON_TYPES.get(type(value), type(value).__name__)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not match:
        lowered = {c.lower(): c for c in choices}
        match = [lowered[word.lower()]] if word.lower() in lowered else []
    return f" (did you mean {match[0]!r}?)" if match else ""


def _unknown_fields(error: Any) -> list[tuple[DocPath, str]]:
    allowed = list(error.schema.get("properties", {}))
    out = []
    for key in error.instance:
        if key in allowed:
            continue
        hint = _did_you_mean(str(key), allowed)
        if not hint and not allowed:
            hint = " (this object takes no fields)"
        elif not hint and len(allowed) <= 12:
            hint = f"; fields here: {', '.join(allowed)}"
        out.append(((*error.absolute_path, key), f"unknown field{hint}"))
    return out


def _wrong_type(error: Any) -> str:
    expected = error.validator_value
    wanted = " or ".join(expected) if isinstance(expected, list) else expected
    got = _json_type(error.instance)
    scalar = got in ("integer", "number", "boolean")
    message = f"expected {wanted}, got {got}" + (f" {json.dumps(error.instance)}" if scalar else "")
    if wanted == "string" and scalar:
        message += f' (quote it in YAML: "{json.dumps(error.instance)}")'
    elif got == "string" and wanted in ("integer", "number") and _is_number(error.instance):
        message += f" {error.instance!r} (remove the quotes: {error.instance})"
    return message


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _describe(error: Any) -> list[tuple[DocPath, str]]:
    """Turn one jsonschema error into ``(path, message)`` pairs a learner can act on."""
    path: DocPath = tuple(error.absolute_path)
    kind = error.validator
    if kind == "additionalProperties" and isinstance(error.instance, dict):
        return _unknown_fields(error)
    if kind == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        return [((*path, name), "required field missing") for name in missing]
    if kind == "type":
        return [(path, _wrong_type(error))]
    if kind == "const":
        return [(path, f"expected {error.validator_value!r}, got {error.instance!r}")]
    if kind == "enum":
        choices = ", ".join(repr(c) for c in error.validator_value)
        hint = (
            _did_you_mean(error.instance, map(str, error.validator_value))
            if isinstance(error.instance, str)
            else ""
        )
        return [(path, f"expected one of {choices}, got {error.instance!r}{hint}")]
    if kind == "pattern" and path == ("metadata", "name"):
        message = "must be lowercase letters, digits, '-' and '.', starting and ending alphanumeric"
        return [(path, f"{error.instance!r} {message}")]
    if kind == "pattern" and QUANTITY_MARK in error.validator_value:
        return [(path, f"{error.instance!r} is not a Kubernetes quantity (like 2, 500m, 8Gi)")]
    if kind == "pattern":
        return [(path, f"{error.instance!r} does not match the pattern {error.validator_value}")]
    return [(path, error.message)]


def format_path(path: DocPath) -> str:
    """``spec.workerGroupSpecs[0].template``; keys with dots are quoted: ``limits["nvidia.com/gpu"]``."""
    text = ""
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
        elif any(c in str(step) for c in '.[]" ') or not str(step):
            text += f"[{json.dumps(str(step))}]"
        else:
            text += f".{step}" if text else str(step)
    return text or "<document>"


def _sort_key(item: tuple[DocPath, str]) -> tuple[Any, ...]:
    return tuple((0, s, "") if isinstance(s, int) else (1, 0, str(s)) for s in item[0]), item[1]


def _errors(data: Any, schemas: Path) -> list[tuple[DocPath, str]]:
    """Every problem of one parsed document as ``(path, message)``, without duplicates."""
    if not isinstance(data, dict):
        return [((), f"expected a mapping with apiVersion and kind, got {_json_type(data)}")]
    validator, problems = _schema_for(data, schemas)
    if validator is None:
        return problems
    found = [item for error in validator.iter_errors(data) for item in _describe(error)]
    return sorted(dict.fromkeys(found), key=_sort_key)


# ---------------------------------------------------------------- public API


def _documents(manifest: dict[str, Any] | str | Path) -> list[Document]:
    if isinstance(manifest, Path):
        try:
            text = manifest.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {manifest}: {exc}") from None
        return load_documents(text)
    if isinstance(manifest, str):
        return load_documents(manifest)
    return [Document(manifest, 1)]


def validate(manifest: dict[str, Any] | str | Path, *, schemas: Path | None = None) -> list[str]:
    """Every problem of a manifest as ``"path: message"``; an empty list means it is valid.

    ``manifest`` is a parsed document (dict), YAML text (str) or a file (Path). Text
    or a file with several documents gets each error prefixed with ``document N: ``.
    A string is always YAML text: to validate a file, pass a ``Path`` or use
    :func:`validate_file`.
    """
    try:
        documents = _documents(manifest)
    except ValueError as exc:
        return [str(exc)]
    if not documents:
        return ["<document>: empty: no YAML document found"]
    several = len(documents) > 1
    out = []
    for doc in documents:
        prefix = f"document {doc.index}: " if several else ""
        for path, message in _errors(doc.data, schemas or SCHEMA_DIR):
            out.append(f"{prefix}{format_path(path)}: {message}")
    return out


def validate_file(path: str | Path, *, schemas: Path | None = None) -> list[str]:
    """Every problem of every document of a YAML file as ``"FILE:LINE: path: message (Kind name)"``."""
    path = Path(path)
    try:
        documents = _documents(path)
    except ValueError as exc:
        return [f"{path}: {exc}"]
    if not documents:
        return [f"{path}: empty: no YAML document found"]
    out = []
    for doc in documents:
        for where, message in _errors(doc.data, schemas or SCHEMA_DIR):
            line = doc.line(where)
            location = f"{path}:{line}" if line else str(path)
            out.append(f"{location}: {format_path(where)}: {message} ({doc.label()})")
    return out


def check(manifest: dict[str, Any] | str | Path, *, schemas: Path | None = None) -> None:
    """Raise ``ValueError`` listing every problem of ``manifest``; return None when it is valid."""
    errors = validate(manifest, schemas=schemas)
    if errors:
        listed = "\n".join(f"  - {e}" for e in errors)
        raise ValueError(f"{len(errors)} problem(s) in the manifest:\n{listed}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ddtk.manifests FILE...``: print every problem; exit 1 if there is any."""
    files = list(sys.argv[1:] if argv is None else argv)
    if not files:
        print("usage: python -m ddtk.manifests FILE.yaml [FILE.yaml ...]", file=sys.stderr)
        return 2
    errors = [error for name in files for error in validate_file(name)]
    for error in errors:
        print(error)
    print(f"{len(files)} file(s), {len(errors)} problem(s)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
