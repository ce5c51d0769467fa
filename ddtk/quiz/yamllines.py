"""YAML read safely, with the line of every mapping and key, so a problem can say where it is.

>>> data = parse_yaml("quiz:\\n  id: demo\\n")
>>> line_of(data["quiz"], "id")
2
"""

from __future__ import annotations

from typing import Any

import yaml

from ddtk.quiz.model import Problem, QuizSourceError

__all__ = ["LineDict", "line_of", "parse_yaml"]


class LineDict(dict):
    """A dict from YAML that remembers its own line and the line of each key."""

    line: int | None = None
    key_lines: dict[Any, int]


class _LineLoader(yaml.SafeLoader):
    """A safe loader whose mappings are :class:`LineDict` and refuse duplicate keys."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in out:
            raise yaml.MarkedYAMLError(
                "while reading a mapping",
                node.start_mark,
                f"duplicate key {key!r} (first on line {out.key_lines[key]})",
                key_node.start_mark,
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = line
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str) -> Any:
    """Parse YAML safely, with line numbers on mappings; raise QuizSourceError on syntax."""
    try:
        return yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise QuizSourceError([Problem(f"invalid YAML: {exc.problem}", line=line)]) from None
    except yaml.YAMLError as exc:
        raise QuizSourceError([Problem(f"invalid YAML: {exc}")]) from None


def line_of(mapping: Any, key: str | None = None) -> int | None:
    """The line of ``key`` in a mapping read by :func:`parse_yaml` (else its own line, or None)."""
    if not isinstance(mapping, LineDict):
        return None
    if key is not None and key in mapping.key_lines:
        return mapping.key_lines[key]
    return mapping.line
