"""The API's JSON parser, with a limit on nesting.

Python's json module recurses once per level: a body of 5,000 nested brackets ends in
RecursionError, a 500 that anyone (the token endpoint takes anonymous callers) could
provoke. No GPUPool request nests deeper than a few levels (an HPO search space is the
deepest), so anything past MAX_DEPTH is refused as a 400.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
            too_deep = True
        else:
            too_deep = depth(data) > MAX_DEPTH
        if too_deep:
            raise ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.")
        return data


def depth(value: Any) -> int:
    """How deeply lists and objects nest in a parsed JSON value (a scalar is 0), without
    recursion: the value may have come from somewhere more lenient than this parser."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            if level <= MAX_DEPTH:
                stack.extend((child, level + 1) for child in children)
    return deepest
