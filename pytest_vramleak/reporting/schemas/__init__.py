"""JSON Schemas of the files the plugin reads back, and a check of a document against one.

``report.schema.json`` describes the JSON report (``--vramleak-report``), which
``python -m pytest_vramleak merge`` reads (``report-v1.schema.json``: its first version, which it
reads too); ``saved-run.schema.json`` a saved run (``--vramleak-save``), which
``--vramleak-compare`` reads. All are JSON Schema 2020-12 and ship
in the package, for other tools to use too. Checking uses the jsonschema library, imported only
when a file is read back.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

SCHEMAS = ("report", "report-v1", "saved-run")


@functools.cache
def load(name: str) -> dict[str, Any]:
    """The schema called ``name`` (one of :data:`SCHEMAS`)."""
    schema: dict[str, Any] = json.loads(
        resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    )
    return schema


def first_problem(document: Any, name: str) -> str | None:
    """The first problem of ``document`` by the schema called ``name``, in one line, or None.

    Problems are ordered by where they are: the entries of a list in order, the keys of an object
    alphabetically, and a value's own problem before those of what it contains (a report whose
    ``tests`` is no list is said to be that, not once for each of its entries).
    """
    from jsonschema import Draft202012Validator

    errors = Draft202012Validator(load(name)).iter_errors(document)
    first = min(
        errors, key=lambda error: tuple((isinstance(key, str), key) for key in error.absolute_path), default=None
    )
    return None if first is None else _describe(first)


def _describe(error: Any) -> str:
    where = json_path(error.absolute_path)
    if error.validator == "type":
        expected = [error.validator_value] if isinstance(error.validator_value, str) else list(error.validator_value)
        return f"{where} is {_kind(error.instance)}, expected {' or '.join(_TYPE_NAMES.get(t, t) for t in expected)}"
    if error.validator == "required":
        missing = next((key for key in error.validator_value if key not in error.instance), error.validator_value[0])
        return f"{where} has no {missing!r}"
    if error.validator == "enum":
        return f"{where} is {_kind(error.instance)}, expected one of {', '.join(json.dumps(v) for v in error.validator_value)}"
    if error.validator == "const":
        return f"{where} is {_kind(error.instance)}, expected {json.dumps(error.validator_value)}"
    message = str(error.message)
    return f"{where}: {message if len(message) <= 120 else message[:117] + '...'}"


_TYPE_NAMES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def _kind(value: Any) -> str:
    """What a JSON value is, as an error message says it: ``a list``, ``the string 'abc'``."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return f"the string {json.dumps(value if len(value) <= 40 else value[:37] + '...')}"
    return f"the number {json.dumps(value)}"


def json_path(keys: Iterable[Any]) -> str:
    """``$.tests[0].nodeid``: where a value is in a document, as JSONPath writes it."""
    path = "$"
    for key in keys:
        if isinstance(key, int):
            path += f"[{key}]"
        elif str(key).isidentifier():
            path += f".{key}"
        else:
            path += f"[{json.dumps(str(key))}]"
    return path
