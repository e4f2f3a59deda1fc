"""Pieces the importers share: the result type and checks of source values."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.spec.profiles import ProfileFile


@dataclass
class ImportResult:
    """Converted profiles, plus warnings about what was skipped and why."""

    profiles: list[ProfileFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def read_json(path: Path, what: str) -> Any:
    """Parse a source JSON file, naming it in the error."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(
            f"cannot read {what} {path}: {exc.strerror or exc}", field="SRC", fix="check the path"
        ) from None
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            field="SRC",
            fix=f"pass an unmodified {what}",
        ) from None


def int_key(key: str, where: str) -> int:
    """A source's string key that must hold a non-negative integer (``"4"`` -> 4)."""
    try:
        value = int(key)
    except (TypeError, ValueError):
        raise SpecError(
            f"{where}: key {key!r} is not an integer", field=where, fix="pass an unmodified file"
        ) from None
    if value < 0:
        raise SpecError(f"{where}: key {key!r} is negative", field=where)
    return value


def seconds(value: Any, where: str) -> float:
    """A finite, non-negative number of seconds from a source file."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{where}: expected a number of seconds, got {value!r}", field=where)
    if value < 0:
        raise SpecError(f"{where}: negative time {value}", field=where)
    return float(value)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A JSON object from a source file, or a one-line error naming where it was expected."""
    if not isinstance(value, dict):
        raise SpecError(
            f"{where}: expected an object, got {type(value).__name__}",
            field=where,
            fix="pass an unmodified source file (docs/formats.md describes it)",
        )
    return value


def select_names(available: list[str], wanted: list[str] | None, flag: str) -> list[str]:
    """``wanted`` (in the given order) if every name is available, else a SpecError."""
    if wanted is None:
        return available
    missing = [w for w in wanted if w not in available]
    if missing:
        raise SpecError(
            f"not in the source: {', '.join(missing)}",
            field=flag,
            fix=f"choose among {', '.join(available) or '(none)'}",
        )
    return list(dict.fromkeys(wanted))
