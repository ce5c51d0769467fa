"""Turn the upstream Kubernetes CRDs in ../shared/crds and ../shared/crds-monitoring-rdma into JSON schemas under deploy/schemas/.

Why: the API server checks a custom resource against its CRD's ``openAPIV3Schema``;
a JSON schema made from the same text lets ``ddtk.manifests.validate`` and the test
suite catch the same mistakes (a misspelt field, a number where a string belongs, a
missing required field) on a laptop, without a cluster.

Usage::

    python scripts/crd_schemas.py                 # read both ../shared folders, write deploy/schemas
    python scripts/crd_schemas.py --check         # exit 1 if deploy/schemas is out of date
    python scripts/crd_schemas.py --crds DIR [--crds DIR ...] --out DIR

One schema is written per CRD kind and served version, named
``<group>_<version>_<Kind>.json`` (``ray.io_v1_RayCluster.json``), plus
``PROVENANCE.json``: for each schema its source file, that file's sha256, the
operator and its version, and the CRD's name, group, version and kind. The output is
deterministic (sorted keys, fixed indent, no dates), so a rerun gives identical bytes.

How the openAPIV3Schema becomes JSON Schema (draft 2020-12):

- ``x-kubernetes-int-or-string: true`` accepts an integer or a string;
- ``nullable: true`` also accepts null;
- an object that lists ``properties`` (or lists nothing at all) and is not
  ``x-kubernetes-preserve-unknown-fields`` gets ``additionalProperties: false``:
  with strict field validation (the default of ``kubectl apply`` since 1.27) the API
  server rejects a field its schema does not know;
- ``x-kubernetes-embedded-resource: true`` objects also allow apiVersion, kind, metadata;
- ``x-kubernetes-list-type: set`` becomes ``uniqueItems: true``;
- a Go regexp ``pattern`` with an inline flag after its start (``^(?i)...``) gets the
  flag moved to the front, where Python's ``re`` wants it;
- the top level requires apiVersion (const ``group/version``), kind (const), metadata
  (an ObjectMeta with a DNS-subdomain ``name``) and spec.

Not converted, so not checked here (the API server still checks them): CEL rules
(``x-kubernetes-validations``), the key uniqueness of ``x-kubernetes-list-type: map``
lists, and int32/int64 ranges. Descriptions are dropped to keep the files small.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CRDS = [ROOT.parent / "shared" / "crds", ROOT.parent / "shared" / "crds-monitoring-rdma"]
DEFAULT_OUT = ROOT / "deploy" / "schemas"
GENERATOR = "scripts/crd_schemas.py"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
PROVENANCE = "PROVENANCE.json"
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster on 6 MB of CRDs

# Where each operator's CRDs come from upstream (see ../shared/crds/README.md).
UPSTREAM = {
    "kuberay": "ray-project/kuberay ray-operator/config/crd/bases/",
    "kubeflow-trainer": "kubeflow/trainer manifests/base/crds/",
    "mpi-operator": "kubeflow/mpi-operator manifests/base/kubeflow.org_mpijobs.yaml",
    "prometheus-operator": "prometheus-operator/prometheus-operator example/prometheus-operator-crd/",
    "network-operator": "Mellanox/network-operator config/crd/bases/ and its sriov-network-operator chart's crds/",
    "multus": "k8snetworkplumbingwg/multus-cni deployments/multus-daemonset.yml (the CRD document)",
}

# Releases of the folders of ../shared/crds-monitoring-rdma, which carry neither a
# version in their name nor a VERSION file: its README names each one's commit.
PINNED = {
    "prometheus-operator": "v0.93.0+24 (6adcebc5076c34f4f55f8f5f7b1e528929373ac7)",
    "network-operator": "v26.7.0-beta.5+ (b06827e085c59726b699faffcc526342d4d8e395)",
    "multus": "v4.3.0+ (95a0932350f0060cd232096876e24672a1de83fa)",
}

# Keywords that mean the same in openAPIV3Schema and JSON Schema, copied as they are.
COPIED = (
    "default",
    "enum",
    "format",
    "maxItems",
    "maxLength",
    "maxProperties",
    "maximum",
    "minItems",
    "minLength",
    "minProperties",
    "minimum",
    "multipleOf",
    "pattern",
    "required",
    "type",
    "exclusiveMaximum",
    "exclusiveMinimum",
    "uniqueItems",
)

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


@dataclass(frozen=True)
class CrdFile:
    """One upstream CRD file and the operator release it belongs to."""

    path: Path
    operator: str
    version: str


# ---------------------------------------------------------------- openAPIV3Schema -> JSON Schema


def _string_map(value_schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": value_schema or {"type": "string"}}


def object_meta(strict_name: bool) -> dict[str, Any]:
    """The ObjectMeta fields a manifest may set (the server fills in the rest, all allowed)."""
    name: dict[str, Any] = {"type": "string", "minLength": 1}
    if strict_name:
        name.update(maxLength=253, pattern=DNS_SUBDOMAIN)
    label_value = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE}
    properties: dict[str, Any] = {
        "name": name,
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": DNS_LABEL},
        "labels": _string_map(label_value),
        "annotations": _string_map(),
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "managedFields": {"type": "array", "items": {"type": "object"}},
        "selfLink": {"type": "string"},
    }
    return {"type": "object", "properties": properties, "additionalProperties": False}


def _types(node: dict[str, Any]) -> list[str]:
    """The JSON types a node accepts, before ``nullable`` is applied."""
    if node.get("x-kubernetes-int-or-string"):
        return ["integer", "string"]
    declared = node.get("type")
    if declared is None:
        return []
    return list(declared) if isinstance(declared, list) else [declared]


def go_pattern(pattern: str) -> str:
    """A Go (RE2) ``pattern`` as one Python's ``re`` accepts: inline flags moved to the front.

    The API server matches ``pattern`` with Go's regexp, which allows ``^(?i)(abort|warn)?$``
    (the Prometheus operator's); Python wants a global flag first: ``(?i)^(abort|warn)?$``.
    """
    flags = re.findall(r"\(\?[imsU]+\)", pattern)
    if not flags or pattern.startswith(flags[0]):
        return pattern
    return "".join(flags) + re.sub(r"\(\?[imsU]+\)", "", pattern)


def convert(node: dict[str, Any]) -> dict[str, Any]:
    """Convert one openAPIV3Schema node (recursively) to JSON Schema."""
    out = {key: node[key] for key in COPIED if key in node}
    if isinstance(out.get("pattern"), str):
        out["pattern"] = go_pattern(out["pattern"])
    types = _types(node)
    if node.get("nullable"):
        types = [*types, "null"] if types else []
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if types:
        out["type"] = types[0] if len(types) == 1 else types
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)  # anyOf [integer, string] only documents the two types
    elif "anyOf" in node or "allOf" in node or "oneOf" in node:
        for key in ("anyOf", "allOf", "oneOf"):
            if key in node:
                out[key] = [convert(sub) for sub in node[key]]
    if "not" in node:
        out["not"] = convert(node["not"])
    if "items" in node:
        out["items"] = convert(node["items"])
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    _convert_object(node, out)
    return out


def _convert_object(node: dict[str, Any], out: dict[str, Any]) -> None:
    """Properties, maps and the closed-object rule of one node into ``out``."""
    properties = {name: convert(sub) for name, sub in node.get("properties", {}).items()}
    if node.get("x-kubernetes-embedded-resource"):
        properties.setdefault("apiVersion", {"type": "string"})
        properties.setdefault("kind", {"type": "string"})
        properties.setdefault("metadata", object_meta(strict_name=False))
    if properties:
        out["properties"] = properties
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = convert(extra)
    elif isinstance(extra, bool):
        out["additionalProperties"] = extra
    elif node.get("x-kubernetes-preserve-unknown-fields"):
        pass  # the API server keeps whatever is there
    elif node.get("type") == "object" or properties:
        out["additionalProperties"] = False


def resource_schema(
    crd_version: dict[str, Any], group: str, kind: str, title: str
) -> dict[str, Any]:
    """The JSON schema of a whole resource of one CRD version, top-level rules included."""
    schema = convert(crd_version["schema"]["openAPIV3Schema"])
    api_version = f"{group}/{crd_version['name']}"
    properties = schema.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string", "const": api_version}
    properties["kind"] = {"type": "string", "const": kind}
    properties["metadata"] = object_meta(strict_name=True)
    properties["metadata"]["required"] = ["name"]
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    if "spec" in properties:
        schema["required"] = sorted({*schema["required"], "spec"})
    schema["additionalProperties"] = False
    return {"$schema": DRAFT, "title": title, **schema}


# ---------------------------------------------------------------- reading the CRDs


def operator_release(folder: Path) -> tuple[str, str]:
    """``(operator, version)`` of a CRD folder: ``kuberay-v1.7.0`` or a folder with VERSION."""
    match = re.fullmatch(r"(.+)-(v\d+\.\d+\.\d+.*)", folder.name)
    if match:
        return match.group(1), match.group(2)
    version_file = folder / "VERSION"
    if version_file.is_file():
        return folder.name, version_file.read_text().strip()
    if folder.name in PINNED:
        return folder.name, PINNED[folder.name]
    raise SystemExit(
        f"error: cannot tell the operator version of {folder}: name it <operator>-v<version> "
        "or put a VERSION file in it"
    )


def crd_files(crds: Path | list[Path]) -> list[CrdFile]:
    """Every CRD YAML file under each of ``crds`` (one sub-folder per operator), in sorted order."""
    roots = [crds] if isinstance(crds, Path) else crds
    found = []
    for root in roots:
        if not root.is_dir():
            raise SystemExit(f"error: no CRD folder at {root} (pass --crds DIR)")
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            operator, version = operator_release(folder)
            for path in sorted(folder.glob("*.yaml")):
                found.append(CrdFile(path, operator, version))
    if not found:
        raise SystemExit(f"error: no *.yaml CRD files in the folders of {', '.join(map(str, roots))}")
    return found


def _display(path: Path) -> str:
    """``path`` relative to the repository root, with forward slashes (stable across machines).

    ``abspath``, not ``resolve``: a ``../shared`` that is a symbolic link stays ``../shared``.
    """
    return Path(os.path.relpath(os.path.abspath(path), ROOT)).as_posix()


def generate(crds: Path | list[Path]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Yield ``(file name, schema, provenance entry)`` for every served version of every CRD."""
    for source in crd_files(crds):
        text = source.path.read_bytes()
        crd = yaml.load(text, Loader=SAFE_LOADER)
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            raise SystemExit(f"error: {source.path} is not a CustomResourceDefinition")
        spec = crd["spec"]
        group, kind = spec["group"], spec["names"]["kind"]
        for version in spec["versions"]:
            if not version.get("served", False):
                continue
            name = f"{group}_{version['name']}_{kind}.json"
            title = f"{kind} ({group}/{version['name']}) from {source.operator} {source.version}"
            entry = {
                "source": _display(source.path),
                "sha256": hashlib.sha256(text).hexdigest(),
                "operator": source.operator,
                "operator_version": source.version,
                "upstream": UPSTREAM.get(source.operator, "unknown"),
                "crd": crd["metadata"]["name"],
                "group": group,
                "version": version["name"],
                "kind": kind,
                "deprecated": bool(version.get("deprecated", False)),
                "storage": bool(version.get("storage", False)),
                "generator": GENERATOR,
            }
            yield name, resource_schema(version, group, kind, title), entry


def dumps(document: Any) -> str:
    """The one serialisation used for every output file: sorted keys, indent 1, newline."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def render(crds: Path | list[Path]) -> dict[str, str]:
    """Every output file's name and text, PROVENANCE.json included."""
    files: dict[str, str] = {}
    provenance: dict[str, Any] = {}
    for name, schema, entry in generate(crds):
        if name in files:
            raise SystemExit(f"error: two CRDs define {name}")
        files[name] = dumps(schema)
        entry["schema_sha256"] = hashlib.sha256(files[name].encode()).hexdigest()
        provenance[name] = entry
    files[PROVENANCE] = dumps(
        {
            "generator": GENERATOR,
            "json_schema": DRAFT,
            "not_checked": [
                "x-kubernetes-validations (CEL rules)",
                "x-kubernetes-list-type: map key uniqueness",
                "int32/int64 ranges",
            ],
            "schemas": provenance,
        }
    )
    return files


# ---------------------------------------------------------------- writing


def _previous_outputs(out: Path) -> set[str]:
    """Schema files the last run recorded in ``out``'s PROVENANCE.json (the ones we own)."""
    try:
        return set(json.loads((out / PROVENANCE).read_text())["schemas"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def write(files: dict[str, str], out: Path) -> list[str]:
    """Write ``files`` into ``out``; remove schemas a previous run wrote that are gone now."""
    out.mkdir(parents=True, exist_ok=True)
    changed = []
    for stale in sorted(_previous_outputs(out) - set(files)):
        (out / stale).unlink(missing_ok=True)
        changed.append(f"removed {stale}")
    for name, text in files.items():
        path = out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(f"wrote {name}")
    return changed


def differences(files: dict[str, str], out: Path) -> list[str]:
    """What ``write`` would change in ``out`` (empty when it is up to date)."""
    problems = [f"{name}: missing" for name in files if not (out / name).is_file()]
    problems += [
        f"{name}: differs"
        for name, text in files.items()
        if (out / name).is_file() and (out / name).read_text(encoding="utf-8") != text
    ]
    problems += [f"{name}: stale" for name in sorted(_previous_outputs(out) - set(files))]
    return problems


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, generate the schemas, and write or check them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--crds",
        type=Path,
        action="append",
        help="folder of upstream CRDs, one sub-folder per operator; repeat for several "
        "(default: ../shared/crds and ../shared/crds-monitoring-rdma)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: deploy/schemas)"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if --out is out of date"
    )
    args = parser.parse_args(argv)
    files = render(args.crds or DEFAULT_CRDS)
    if args.check:
        problems = differences(files, args.out)
        for problem in problems:
            print(problem)
        if problems:
            print(f"{args.out} is out of date: run python {GENERATOR}", file=sys.stderr)
            return 1
        print(f"{args.out}: {len(files) - 1} schemas up to date")
        return 0
    changed = write(files, args.out)
    for line in changed:
        print(line)
    print(f"{args.out}: {len(files) - 1} schemas, {len(changed)} file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
