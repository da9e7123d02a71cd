"""Strict readers for the JSON and YAML a user hands us: one meaning per file, or one clear error.

The standard readers let the last of two equal keys win, and raise bare `ValueError` or
`RecursionError` on a 5,000-digit integer or a deeply nested document. A gate config with
`min_delta` twice, or a scores line with `reward` twice, then means whatever its last spelling
says; these readers refuse it instead, naming the key and where it is.
Callers wrap `StrictInputError` in their own boundary's error with the file's name.
"""

import json
from collections.abc import Hashable
from typing import Any

import yaml


class StrictInputError(ValueError):
    """A document that is valid JSON/YAML but has no single meaning, or is too big to read."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise StrictInputError(f"key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def loads_json(text: str | bytes) -> Any:
    """`json.loads` that refuses duplicate keys, huge integers and deep nesting.

    `NaN` and `Infinity` still parse: the pydantic models they meet refuse them by field name.

    Raises:
        StrictInputError: what is wrong, in words (the caller adds the file and line).
        json.JSONDecodeError: the text is not JSON at all.
    """
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError as e:
        raise StrictInputError("nested too deeply to read") from e
    except (StrictInputError, json.JSONDecodeError):
        raise
    except ValueError as e:  # Python's int-digit limit: a number no field can hold
        raise StrictInputError(f"a number too long to read ({str(e).split(':')[0]})") from e


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names one key twice (with the line)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Hashable, Any]:
        """Build a mapping as SafeLoader does, after checking its keys are distinct."""
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    continue  # SafeLoader's own error says an unhashable key is refused
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"key {key!r} appears twice in one mapping (line "
                        f"{key_node.start_mark.line + 1}); keep one",
                        key_node.start_mark,
                    )  # fmt: skip
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def loads_yaml(text: str) -> Any:
    """`yaml.safe_load` with `UniqueKeyLoader`; deep nesting is a `StrictInputError`."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError as e:
        raise StrictInputError("nested too deeply to read") from e
