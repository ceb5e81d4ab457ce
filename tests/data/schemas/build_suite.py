"""Writes the JSON-schema suite (``json/*.json``) used by the grammar validity tests.

Hand-written domain schemas plus systematic variants of each feature family: bounded numbers,
string lengths/patterns/formats, enums/const, arrays with min/max items and tuples, nested
objects, anyOf/oneOf/allOf, $ref/$defs (recursive too), pydantic models. Each file is one schema
with a ``title``. Run ``python tests/data/schemas/build_suite.py`` to regenerate.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "json"


def obj(props: dict[str, Any], required: list[str] | None = None, **kw: Any) -> dict:
    d = {"type": "object", "properties": props, **kw}
    d["required"] = list(props) if required is None else required
    return d


S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


def primitives() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for lo, hi in [(0, 9), (1, 100), (-50, 50), (1900, 2100), (0, 1), (-1000, -1), (10, 10)]:
        out[f"int_range_{lo}_{hi}"] = {"type": "integer", "minimum": lo, "maximum": hi}
    out["int_exclusive"] = {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}
    out["int_min_only"] = {"type": "integer", "minimum": 18}
    out["int_max_only"] = {"type": "integer", "maximum": -3}
    for lo, hi in [(0, 1), (-90, 90), (0.5, 99.5), (-1e3, 1e3)]:
        out[f"num_range_{lo}_{hi}"] = {"type": "number", "minimum": lo, "maximum": hi}
    out["num_exclusive_min"] = {"type": "number", "exclusiveMinimum": 0}
    for lo, hi in [(1, 5), (0, 3), (2, 2), (3, 12), (1, 40)]:
        out[f"str_len_{lo}_{hi}"] = {"type": "string", "minLength": lo, "maxLength": hi}
    patterns = {"zip": r"^[0-9]{5}(-[0-9]{4})?$", "hex_color": r"^#[0-9a-fA-F]{6}$",
                "sku": r"^[A-Z]{3}-[0-9]{4}$", "phone": r"^\+?[0-9]{7,12}$",
                "slug": r"^[a-z0-9]+(-[a-z0-9]+)*$", "semver": r"^[0-9]+\.[0-9]+\.[0-9]+$",
                "ident": r"^[A-Za-z_][A-Za-z0-9_]{0,15}$", "isbn10": r"^[0-9]{9}[0-9X]$",
                "time_hm": r"^([01][0-9]|2[0-3]):[0-5][0-9]$", "upper_word": r"^[A-Z]+$"}
    for name, p in patterns.items():
        out[f"pattern_{name}"] = {"type": "string", "pattern": p}
    for fmt in ["date", "date-time", "time", "email", "uuid", "ipv4", "uri", "hostname",
                "ipv6", "duration"]:
        out[f"format_{fmt}"] = {"type": "string", "format": fmt}
    enums = {"color": ["red", "green", "blue"], "size": ["S", "M", "L", "XL"],
             "status": ["open", "closed", "pending review"], "mixed": [1, "two", None, True],
             "nums": [3, 5, 8, 13], "single": ["only"], "unicode": ["café", "naïve", "日本"]}
    for name, values in enums.items():
        out[f"enum_{name}"] = {"enum": values}
    out["const_string"] = {"const": "fixed value"}
    out["const_number"] = {"const": 42}
    out["const_object"] = {"const": {"a": 1, "b": [True, None]}}
    out["boolean"] = dict(B)
    out["null"] = {"type": "null"}
    out["string_plain"] = dict(S)
    out["number_plain"] = dict(N)
    out["multi_type"] = {"type": ["string", "integer", "null"]}
    out["int_multiple_of"] = {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}
    return out


DOMAIN: dict[str, dict] = {
    "person": obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}}),
    "address": obj({"street": S, "city": S, "zip": {"type": "string", "pattern": r"^[0-9]{5}$"},
                    "country": {"enum": ["US", "CA", "MX"]}}),
    "product": obj({"sku": S, "title": {"type": "string", "maxLength": 40},
                    "price": {"type": "number", "minimum": 0}, "in_stock": B}),
    "book": obj({"title": S, "author": S, "year": {"type": "integer", "minimum": 1450,
                                                    "maximum": 2030},
                 "isbn": {"type": "string", "pattern": r"^[0-9]{13}$"}}, ["title", "author"]),
    "movie": obj({"title": S, "rating": {"type": "number", "minimum": 0, "maximum": 10},
                  "genres": {"type": "array", "items": S, "maxItems": 3}}),
    "weather": obj({"city": S, "temp_c": {"type": "number", "minimum": -90, "maximum": 60},
                    "condition": {"enum": ["sunny", "cloudy", "rain", "snow"]}}),
    "flight": obj({"flight_no": {"type": "string", "pattern": r"^[A-Z]{2}[0-9]{2,4}$"},
                   "from": {"type": "string", "pattern": r"^[A-Z]{3}$"},
                   "to": {"type": "string", "pattern": r"^[A-Z]{3}$"},
                   "departure": {"type": "string", "format": "date-time"}}),
    "employee": obj({"id": {"type": "integer", "minimum": 1}, "name": S,
                     "email": {"type": "string", "format": "email"},
                     "manager_id": {"type": ["integer", "null"]}}),
    "recipe": obj({"name": S, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                   "ingredients": {"type": "array", "minItems": 1, "maxItems": 5,
                                   "items": obj({"item": S, "grams": {"type": "number",
                                                                      "minimum": 0}})}}),
    "event": obj({"name": S, "date": {"type": "string", "format": "date"},
                  "attendees": {"type": "integer", "minimum": 0}, "virtual": B}),
    "login": obj({"username": {"type": "string", "minLength": 3, "maxLength": 16},
                  "remember_me": B}, ["username"]),
    "sentiment": obj({"label": {"enum": ["positive", "negative", "neutral"]},
                      "score": {"type": "number", "minimum": 0, "maximum": 1}}),
    "geo_point": obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                      "lon": {"type": "number", "minimum": -180, "maximum": 180}}),
    "rgb": obj({c: {"type": "integer", "minimum": 0, "maximum": 255} for c in "rgb"}),
    "invoice": obj({"number": S, "lines": {"type": "array", "minItems": 1, "maxItems": 4,
                                           "items": obj({"desc": S, "qty": {"type": "integer",
                                                                            "minimum": 1},
                                                         "unit_price": N})},
                    "currency": {"enum": ["USD", "EUR"]}, "paid": B}),
    "log_entry": obj({"level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]},
                      "ts": {"type": "string", "format": "date-time"}, "msg": S}),
    "http_request": obj({"method": {"enum": ["GET", "POST", "PUT", "DELETE"]},
                         "path": {"type": "string", "pattern": r"^/[a-z0-9/_-]*$"},
                         "headers": {"type": "object", "additionalProperties": S}},
                        ["method", "path"]),
    "config": obj({"debug": B, "workers": {"type": "integer", "minimum": 1, "maximum": 64},
                   "name": S}, []),
    "user_profile": obj({"handle": {"type": "string", "pattern": r"^@[a-z0-9_]{1,15}$"},
                         "bio": {"type": "string", "maxLength": 60},
                         "followers": {"type": "integer", "minimum": 0}}, ["handle"]),
    "task": obj({"title": S, "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                 "done": B, "tags": {"type": "array", "items": S, "uniqueItems": True}}),
    "calendar_slot": obj({"start": {"type": "string", "format": "time"},
                          "end": {"type": "string", "format": "time"}}),
    "car": obj({"make": S, "model": S, "year": {"type": "integer", "minimum": 1950,
                                                 "maximum": 2026},
                "electric": B}),
    "country": obj({"name": S, "code": {"type": "string", "pattern": r"^[A-Z]{2}$"},
                    "population": {"type": "integer", "minimum": 0}}),
    "quiz_answer": obj({"question_id": I, "choice": {"enum": ["A", "B", "C", "D"]}}),
    "math_answer": obj({"reasoning": {"type": "string", "maxLength": 80}, "answer": I}),
    "ner": obj({"entities": {"type": "array", "maxItems": 4, "items": obj({
        "text": S, "type": {"enum": ["PER", "ORG", "LOC"]}})}}),
    "classification": obj({"category": {"enum": ["spam", "ham"]},
                           "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
    "tool_call": obj({"name": {"enum": ["search", "calculator", "weather"]},
                      "arguments": {"type": "object"}}),
    "pagination": obj({"page": {"type": "integer", "minimum": 1}, "per_page": {
        "type": "integer", "minimum": 1, "maximum": 100}, "total": I}),
    "version_info": obj({"version": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+\.[0-9]+$"},
                         "released": {"type": "string", "format": "date"}}),
    "uuid_record": obj({"id": {"type": "string", "format": "uuid"}, "value": N}),
    "server": obj({"host": {"type": "string", "format": "ipv4"},
                   "port": {"type": "integer", "minimum": 1, "maximum": 65535}}),
    "link": obj({"url": {"type": "string", "format": "uri"}, "label": S}),
    "review": obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                   "text": {"type": "string", "maxLength": 100}, "verified": B}),
    "transaction": obj({"amount": {"type": "number", "exclusiveMinimum": 0},
                        "type": {"enum": ["debit", "credit"]},
                        "memo": {"type": ["string", "null"]}}),
    "optional_only": obj({"a": I, "b": S, "c": B}, []),
    "one_required_of_many": obj({"a": I, "b": S, "c": B, "d": N}, ["c"]),
    "empty_object": {"type": "object", "properties": {}, "additionalProperties": False},
    "free_object": {"type": "object"},
    "dict_of_ints": {"type": "object", "additionalProperties": I},
}


def arrays() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for lo, hi in [(0, 3), (1, 1), (2, 4), (3, 3), (1, 6)]:
        out[f"array_int_{lo}_{hi}"] = {"type": "array", "items": I, "minItems": lo,
                                      "maxItems": hi}
        out[f"array_str_{lo}_{hi}"] = {"type": "array", "items": {"type": "string",
                                                                  "maxLength": 8},
                                      "minItems": lo, "maxItems": hi}
    out["array_enum"] = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 5}
    out["array_bool_min2"] = {"type": "array", "items": B, "minItems": 2}
    out["array_objects"] = {"type": "array", "maxItems": 3, "items": obj({"k": S, "v": I})}
    out["array_of_arrays"] = {"type": "array", "maxItems": 3,
                              "items": {"type": "array", "items": I, "maxItems": 3}}
    out["tuple_prefix"] = {"type": "array", "prefixItems": [S, I, B], "items": False}
    out["tuple_point"] = {"type": "array", "prefixItems": [N, N], "minItems": 2, "items": False}
    out["array_unique"] = {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                      "maximum": 9},
                           "uniqueItems": True, "maxItems": 4}
    out["array_untyped"] = {"type": "array", "maxItems": 4}
    out["array_nullable_items"] = {"type": "array", "items": {"type": ["integer", "null"]},
                                   "maxItems": 4}
    out["array_contains"] = {"type": "array", "items": I, "contains": {"const": 7},
                             "maxItems": 4}
    return out


def unions() -> dict[str, dict]:
    circle = obj({"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}})
    square = obj({"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}})
    return {
        "anyof_str_int": {"anyOf": [S, I]},
        "anyof_nullable_obj": {"anyOf": [obj({"x": I}), {"type": "null"}]},
        "oneof_shapes": {"oneOf": [circle, square]},
        "anyof_shapes_array": {"type": "array", "maxItems": 3, "items": {"anyOf": [circle,
                                                                                   square]}},
        "oneof_int_ranges": {"oneOf": [{"type": "integer", "maximum": -1},
                                       {"type": "integer", "minimum": 1}]},
        "anyof_formats": {"anyOf": [{"type": "string", "format": "date"},
                                    {"type": "string", "format": "email"}]},
        "allof_merge": {"allOf": [obj({"a": I}), obj({"b": S})]},
        "allof_bounds": {"allOf": [{"type": "integer", "minimum": 0},
                                   {"type": "integer", "maximum": 9}]},
        "anyof_enum_or_pattern": {"anyOf": [{"enum": ["none"]},
                                            {"type": "string", "pattern": r"^[0-9]{3}$"}]},
        "nullable_property": obj({"name": S, "nick": {"anyOf": [S, {"type": "null"}]}}),
        "oneof_payment": {"oneOf": [
            obj({"method": {"const": "card"}, "last4": {"type": "string",
                                                        "pattern": r"^[0-9]{4}$"}}),
            obj({"method": {"const": "iban"}, "iban": {"type": "string", "minLength": 15,
                                                       "maxLength": 34}}),
            obj({"method": {"const": "cash"}})]},
        "anyof_array_or_string": {"anyOf": [{"type": "array", "items": S, "maxItems": 2}, S]},
        "type_list_object": obj({"v": {"type": ["number", "boolean"]}}),
        "anyof_nested": obj({"data": {"anyOf": [obj({"ok": {"const": True}, "value": I}),
                                                obj({"ok": {"const": False}, "error": S})]}}),
        "not_string": {"not": S},
        "if_then_else": {"type": "object", "properties": {"kind": {"enum": ["a", "b"]},
                                                          "n": I},
                         "required": ["kind", "n"],
                         "if": {"properties": {"kind": {"const": "a"}}},
                         "then": {"properties": {"n": {"minimum": 10}}}},
        "dependent_required": {"type": "object", "properties": {"card": S, "cvv": S},
                               "dependentRequired": {"card": ["cvv"]}},
        "min_properties": {"type": "object", "additionalProperties": I, "minProperties": 2,
                           "maxProperties": 3},
        "pattern_properties": {"type": "object", "patternProperties": {"^x_": I},
                               "additionalProperties": False},
        "property_names": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                           "additionalProperties": I},
    }


def refs() -> dict[str, dict]:
    node = {"type": "object", "properties": {"value": I, "children": {
        "type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
        "required": ["value", "children"]}
    person = obj({"name": S, "address": {"$ref": "#/$defs/address"}})
    return {
        "ref_address": {"$defs": {"address": DOMAIN["address"]}, **person},
        "ref_tree": {"$defs": {"node": node}, "$ref": "#/$defs/node"},
        "ref_linked_list": {"$defs": {"cell": {"type": "object", "properties": {
            "v": I, "next": {"anyOf": [{"$ref": "#/$defs/cell"}, {"type": "null"}]}},
            "required": ["v", "next"]}}, "$ref": "#/$defs/cell"},
        "ref_shared_twice": {"$defs": {"pt": DOMAIN["geo_point"]},
                             **obj({"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}})},
        "ref_definitions_legacy": {"definitions": {"color": {"enum": ["red", "blue"]}},
                                   **obj({"fg": {"$ref": "#/definitions/color"},
                                          "bg": {"$ref": "#/definitions/color"}})},
        "ref_array_items": {"$defs": {"item": obj({"id": I, "label": S})},
                            "type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/item"}},
        "ref_chain": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"},
                                "c": {"type": "integer", "minimum": 0, "maximum": 99}},
                      **obj({"x": {"$ref": "#/$defs/a"}})},
        "ref_in_anyof": {"$defs": {"num": N, "txt": S},
                         "anyOf": [{"$ref": "#/$defs/num"}, {"$ref": "#/$defs/txt"}]},
        "ref_expression": {"$defs": {"expr": {"anyOf": [I, obj({
            "op": {"enum": ["+", "*"]}, "args": {"type": "array", "minItems": 2, "maxItems": 2,
                                                 "items": {"$ref": "#/$defs/expr"}}})]}},
            "$ref": "#/$defs/expr"},
        "ref_root_properties": {"$defs": {"meta": obj({"created": {"type": "string",
                                                                   "format": "date"}})},
                                **obj({"meta": {"$ref": "#/$defs/meta"}, "body": S})},
    }


def nested() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for depth in range(2, 7):
        node: dict = {"type": "integer", "minimum": 0, "maximum": depth * 10}
        for level in range(depth):
            node = obj({f"l{level}": node, "tag": {"type": "string", "maxLength": 5}},
                       [f"l{level}"])
        out[f"nested_depth_{depth}"] = node
    out["nested_company"] = obj({"name": S, "hq": DOMAIN["address"], "departments": {
        "type": "array", "maxItems": 2, "items": obj({"name": S, "head": DOMAIN["person"],
                                                      "budget": {"type": "number",
                                                                 "minimum": 0}})}})
    out["nested_order"] = obj({"id": S, "customer": DOMAIN["person"], "items": {
        "type": "array", "minItems": 1, "maxItems": 3, "items": DOMAIN["product"]},
        "shipping": obj({"address": DOMAIN["address"], "express": B})})
    out["nested_matrix"] = obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer",
                                                                 "minimum": 0, "maximum": 9}}}})
    out["nested_api_response"] = obj({"status": {"enum": ["ok", "error"]}, "data": obj({
        "users": {"type": "array", "maxItems": 2, "items": DOMAIN["employee"]},
        "page": DOMAIN["pagination"]})})
    out["nested_optional_blocks"] = obj({"a": obj({"b": obj({"c": obj({"d": B}, [])}, [])}, [])},
                                        [])
    return out


def pydantic_schemas() -> dict[str, dict]:
    from datetime import date
    from enum import Enum
    from typing import Literal, Optional

    from pydantic import BaseModel, Field

    class Color(str, Enum):
        red = "red"
        green = "green"

    class Item(BaseModel):
        name: str = Field(max_length=20)
        qty: int = Field(ge=1, le=99)

    class Cart(BaseModel):
        items: list[Item] = Field(min_length=1, max_length=3)
        coupon: Optional[str] = None

    class Character(BaseModel):
        name: str
        age: int = Field(ge=0, le=500)
        armor: Literal["leather", "chainmail", "plate"]
        strength: int = Field(ge=1, le=20)

    class Paint(BaseModel):
        color: Color
        litres: float = Field(gt=0, le=20)

    class Birthday(BaseModel):
        who: str
        on: date

    class Flags(BaseModel):
        a: bool
        b: bool = True

    class Tree(BaseModel):
        label: str = Field(max_length=6)
        kids: list["Tree"] = Field(default_factory=list, max_length=2)

    class Extraction(BaseModel):
        company: str
        founded: int = Field(ge=1800, le=2025)
        public: bool
        tickers: list[str] = Field(default_factory=list, max_length=2)

    models = [Item, Cart, Character, Paint, Birthday, Flags, Tree, Extraction]
    return {f"pydantic_{m.__name__.lower()}": m.model_json_schema() for m in models}


def main() -> None:
    groups = {"prim": primitives(), "obj": DOMAIN, "arr": arrays(), "union": unions(),
              "ref": refs(), "nest": nested(), "py": pydantic_schemas()}
    # Optional-field variants of the domain objects: the same shape with nothing required.
    groups["optional"] = {k: {**v, "required": []} for k, v in DOMAIN.items()
                          if v.get("properties")}
    # Closed variants: no properties beyond the listed ones.
    groups["closed"] = {k: {**v, "additionalProperties": False}
                        for k, v in list(DOMAIN.items())[:15]}
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    count = 0
    for group, schemas in groups.items():
        for name, schema in schemas.items():
            schema = {"title": f"{group}_{name}", **schema}
            (OUT / f"{group}_{name}.json").write_text(json.dumps(schema, indent=1) + "\n")
            count += 1
    print(f"wrote {count} schemas to {OUT}")


if __name__ == "__main__":
    main()
