"""Strict reading of user files: text checks, YAML without surprises, values checked by type.

Everything here raises :class:`~orchestrator.errors.SpecError` with one line that names the file
and the field, before any validation by pydantic (which would accept or misreport these):

- the file: missing, a folder, empty or comment-only, binary, UTF-16 or otherwise not UTF-8;
- YAML: a key given twice in one mapping (with both lines); numbers written ``16e9`` are read as
  numbers (YAML 1.1 would read them as strings);
- values: NaN and infinities anywhere; a boolean where the field is a number.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from orchestrator.errors import SpecError

# YAML 1.2 floats, e.g. 16e9, 1E-3, 2.5e+10 (YAML 1.1, PyYAML's default, wants "1.0e+9").
_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys and reading ``16e9`` as a number."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if isinstance(key, typing.Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} appears twice (lines {seen[key]} and {line}); keep one",
                key_node.start_mark,
            )
        if isinstance(key, typing.Hashable):
            seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


def read_text(path: Path | str, what: str = "file") -> str:
    """The file's text, refusing missing files, folders, empty, binary and non-UTF-8 files."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(f"{p} is a folder, not a {what}", fix=f"give the path of the {what}")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"cannot read {p}: no such file", fix="check the path") from None
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc.strerror or exc}", fix="check the path") from None
    if not data.strip():
        raise SpecError(f"{p}: the file is empty", fix=f"write the {what}'s fields into it")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise SpecError(f"{p}: the file is UTF-16 text", fix="save it as UTF-8")
    if b"\x00" in data:
        raise SpecError(f"{p}: a binary file, not text", fix=f"give the {what} (YAML or JSON)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{p}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            fix="save it as UTF-8",
        ) from None


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object; keep one")
        out[key] = value
    return out


def parse_text(text: str, source: str, json_only: bool = False) -> Any:
    """YAML (or JSON, which is YAML) to Python values, refusing comment-only documents."""
    try:
        if json_only:
            raw = json.loads(text, object_pairs_hook=_json_pairs)
        else:
            raw = yaml.load(text, Loader=StrictLoader)  # a subclass of SafeLoader
    except (yaml.YAMLError, json.JSONDecodeError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            detail = (
                f"line {mark.line + 1}, column {mark.column + 1}: {getattr(exc, 'problem', '')}"
            )
        elif isinstance(exc, json.JSONDecodeError):
            detail = f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
        raise SpecError(f"{source}: not valid YAML/JSON ({detail})", fix="fix the syntax") from None
    if raw is None:
        raise SpecError(
            f"{source}: the file is empty (only comments or blank lines)",
            fix="write the fields into it (docs/formats.md)",
        )
    return raw


def _location(path: tuple[Any, ...]) -> str:
    loc = ""
    for part in path:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    return loc


def _walk(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, (*path, key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _walk(item, (*path, i))


def check_finite(raw: Any, source: str) -> None:
    """Refuse NaN and infinities anywhere in a document (no field of ours means them)."""
    for path, value in _walk(raw):
        if isinstance(value, float) and not math.isfinite(value):
            where = _location(path) or "value"
            raise SpecError(
                f"{source}: {where}: {value} is not a finite number",
                field=where,
                fix="give a finite number",
            )


def _allows(annotation: Any, wanted: type) -> bool:
    """Whether a field's annotation accepts ``wanted`` as it is (``Any`` does)."""
    if annotation is Any or annotation is wanted:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _allows(typing.get_args(annotation)[0], wanted)
    if origin in (typing.Union, types.UnionType):
        return any(_allows(a, wanted) for a in typing.get_args(annotation))
    return False


def _submodels(annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """("", Model) for a model field, ("[]", Model) for a list of them, ("{}", Model) for a dict."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation
    elif origin is typing.Annotated:
        yield from _submodels(typing.get_args(annotation)[0])
    elif origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _submodels(arg)
    elif origin in (list, tuple):
        for arg in typing.get_args(annotation):
            for kind, model in _submodels(arg):
                if kind == "":
                    yield "[]", model
    elif origin is dict:
        args = typing.get_args(annotation)
        if len(args) == 2:
            for kind, model in _submodels(args[1]):
                if kind == "":
                    yield "{}", model


def check_booleans(
    kind: type[BaseModel], raw: Any, source: str, path: tuple[Any, ...] = ()
) -> None:
    """Refuse ``true``/``false`` for a field that is not a boolean (pydantic reads it as 1/0)."""
    if not isinstance(raw, dict):
        return
    for name, info in kind.model_fields.items():
        key = info.alias or name
        if key not in raw:
            continue
        value = raw[key]
        annotation = info.annotation
        where = (*path, key)
        if isinstance(value, bool) and not _allows(annotation, bool):
            loc = _location(where)
            raise SpecError(
                f"{source}: {loc}: {str(value).lower()} is a boolean, not a number",
                field=loc,
                fix="give a number (docs/formats.md)",
            )
        if isinstance(value, list | dict) and _elements_are_numbers(annotation):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for i, item in items:
                if isinstance(item, bool):
                    loc = _location((*where, i))
                    raise SpecError(
                        f"{source}: {loc}: {str(item).lower()} is a boolean, not a number",
                        field=loc,
                        fix="give a number",
                    )
        for container, model in _submodels(annotation):
            if container == "" and isinstance(value, dict):
                check_booleans(model, value, source, where)
            elif container == "[]" and isinstance(value, list):
                for i, item in enumerate(value):
                    check_booleans(model, item, source, (*where, i))
            elif container == "{}" and isinstance(value, dict):
                for k, item in value.items():
                    check_booleans(model, item, source, (*where, k))


def _elements_are_numbers(annotation: Any) -> bool:
    """Whether the annotation is a list, tuple or dict (values) of plain numbers."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _elements_are_numbers(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_elements_are_numbers(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        return any(_is_number(a) for a in typing.get_args(annotation))
    if origin is dict:
        args = typing.get_args(annotation)
        return len(args) == 2 and _is_number(args[1])
    return False


def _is_number(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_number(typing.get_args(annotation)[0])
    return False
