"""What a JSON schema leaves unsaid, read the way structured-output engines read it by default
(llama.cpp's json-schema-to-grammar, xgrammar's strict mode): an object that lists its
`properties` and does not mention `additionalProperties` takes no other keys (each listed key
once), and a number or string with no bounds of its own gets bounds (MAX_INTEGER_DIGITS, ...),
so that a small model cannot pad a reply with invented keys or digits until the token limit.

`SchemaReading.AS_WRITTEN` is JSON Schema's own reading (other keys allowed, no bounds), for a
client that wants it (`tr serve --open-schemas`, or `"open_schemas": true` in a request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_INTEGER_DIGITS = 18  # an integer's digits where the schema bounds neither side (int64 fits 18)
MAX_WHOLE_DIGITS = 12  # a number's digits before the point, where the schema bounds neither side
MAX_FRACTION_DIGITS = 8  # and after it, where the schema gives no multipleOf
MAX_STRING_CHARS = 2000  # a string's characters, where the schema gives no maxLength, pattern or format

_OPEN_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "patternProperties")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


@dataclass(frozen=True)
class SchemaReading:
    close_objects: bool = True
    bound_values: bool = True

    def apply(self, schema: Any) -> Any:
        """`schema` with what it leaves unsaid filled in (a new schema; the given one unchanged)."""
        if not (self.close_objects or self.bound_values):
            return schema
        return self._node(schema, in_all_of=False)

    def _node(self, node: Any, in_all_of: bool) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                out[key] = {name: self._node(value, False) for name, value in node[key].items()}
        for key in _SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                out[key] = [self._node(value, False) for value in node[key]]
        if isinstance(node.get("allOf"), list):  # parts merge: closing one would refuse the others' keys
            out["allOf"] = [self._node(value, True) for value in node["allOf"]]
        for key in _SUBSCHEMAS:
            if isinstance(node.get(key), dict):
                out[key] = self._node(node[key], False)
        if (
            self.close_objects
            and not in_all_of
            and isinstance(node.get("properties"), dict)
            and not any(key in node for key in _OPEN_KEYWORDS)
            and "allOf" not in node
        ):
            out["additionalProperties"] = False
        if self.bound_values and "enum" not in node and "const" not in node:
            self._bound(out)
        return out

    @staticmethod
    def _bound(node: dict) -> None:
        types = node.get("type")
        types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
        if "number" in types and not any(key in node for key in (*_BOUNDS, "multipleOf")):
            limit = 10**MAX_WHOLE_DIGITS
            node.update(minimum=-limit, maximum=limit, multipleOf=10.0**-MAX_FRACTION_DIGITS)
        elif "integer" in types and "number" not in types and not any(key in node for key in _BOUNDS):
            limit = 10**MAX_INTEGER_DIGITS - 1
            node.update(minimum=-limit, maximum=limit)
        if "string" in types and not any(key in node for key in ("maxLength", "pattern", "format")):
            node["maxLength"] = MAX_STRING_CHARS


STRICT = SchemaReading()
AS_WRITTEN = SchemaReading(close_objects=False, bound_values=False)
