"""Strict readers for the JSON and YAML a user hands us: one meaning per file, or one clear error.

The standard readers let the last of two equal keys win, and raise bare `ValueError` or
`RecursionError` on a 5,000-digit integer or a deeply nested document. A gate config with
`min_delta` twice, or a scores line with `reward` twice, then means whatever its last spelling
says; these readers refuse it instead, naming the key and where it is.
Each raises a plain `ValueError` saying what is wrong in words; callers wrap it in their own
boundary's error with the file's name (after `json.JSONDecodeError` and pydantic's
`ValidationError`, which are `ValueError`s too).
"""

import json
from collections.abc import Hashable
from typing import Any

import yaml


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def loads_json(text: str | bytes) -> Any:
    """`json.loads` that refuses duplicate keys, huge integers and deep nesting.

    `NaN` and `Infinity` still parse: the pydantic models they meet refuse them by field name.

    Raises:
        json.JSONDecodeError: the text is not JSON at all.
        ValueError: what is wrong, in words (the caller adds the file and line).
    """
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError as e:
        raise ValueError("nested too deeply to read") from e
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError) or not str(e).startswith("Exceeds the limit"):
            raise
        raise ValueError("a number too long to read (over Python's digit limit)") from e


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
    """`yaml.safe_load` with `UniqueKeyLoader`; deep nesting is a `ValueError`."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError as e:
        raise ValueError("nested too deeply to read") from e
