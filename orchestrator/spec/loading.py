"""Read user files (YAML or JSON) into validated specs, with one-line errors.

Every loader raises :class:`~orchestrator.errors.SpecError` naming the file, the field and the fix;
nothing here prints or exits, the command line does that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec.cluster import ClusterSpec
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan

SpecT = TypeVar("SpecT", bound=BaseModel)


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line for the first problem pydantic found: ``source: a.b[0].c: message``."""
    first = exc.errors()[0]
    loc = ""
    for part in first["loc"]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field; remove it or check its spelling (docs/formats.md lists the fields)"
    elif first["type"] == "missing":
        msg = "required field is missing; add it (docs/formats.md)"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    where = f"{source}: {loc}" if loc else source
    return f"{where}: {msg}{more}"


def read_document(path: Path | str) -> Any:
    """Parse a YAML or JSON file (JSON is YAML), with a clear error for unreadable files."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc.strerror or exc}", fix="check the path") from None
    try:
        if p.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            detail = (
                f"line {mark.line + 1}, column {mark.column + 1}: {getattr(exc, 'problem', '')}"
            )
        raise SpecError(f"{p}: not valid YAML/JSON ({detail})", fix="fix the syntax") from None


def parse_spec(
    kind: type[SpecT], raw: Any, source: str, context: dict[str, Any] | None = None
) -> SpecT:
    """Validate an already-parsed document as ``kind``.

    ``context`` carries what a spec may need from the layers above it (e.g. the runtime's
    measurer of a user's module); it is passed to the validators beside ``source``.
    """
    if not isinstance(raw, dict):
        raise SpecError(
            f"{source}: expected a mapping of fields at the top level, got {type(raw).__name__}"
        )
    try:
        # The source lets specs resolve files named relative to it (a job's model folder).
        return kind.model_validate(raw, context={**(context or {}), "source": source})
    except ValidationError as exc:
        raise SpecError(describe_validation_error(exc, source)) from None


def load_spec(
    kind: type[SpecT], path: Path | str, context: dict[str, Any] | None = None
) -> SpecT:
    """Read and validate a file as ``kind``."""
    return parse_spec(kind, read_document(path), str(path), context)


def load_cluster(path: Path | str) -> ClusterSpec:
    return load_spec(ClusterSpec, path)


def load_model(path: Path | str) -> ModelSpec:
    """A model.yaml, or a Hugging Face model folder (its config.json gives the shape)."""
    from orchestrator.spec.hf_config import is_hf_folder, load_hf_model_spec

    if is_hf_folder(path):
        return load_hf_model_spec(path)
    return load_spec(ModelSpec, path)


def load_training(path: Path | str | None) -> TrainingSpec:
    return TrainingSpec() if path is None else load_spec(TrainingSpec, path)


def load_plan(path: Path | str) -> Plan:
    return load_spec(Plan, path)
