"""Read user files (YAML or JSON) into validated specs, with one-line errors.

Every loader raises :class:`~orchestrator.errors.SpecError` naming the file, the field and the fix;
nothing here prints or exits, the command line does that.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec.cluster import ClusterSpec
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import PLAN_FORMAT, Plan
from orchestrator.spec.strict import check_booleans, check_finite, parse_text, read_text

SpecT = TypeVar("SpecT", bound=BaseModel)


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line for the first problem pydantic found: ``source: a.b[0].c: message``.

    An unknown field beside a missing one is reported as the likely typo it is ("did you mean"),
    and a string where a number belongs (``16GB``) says which form is accepted.
    """
    errors = exc.errors()
    first = _typo_first(errors)
    loc = _loc(first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field; remove it or check its spelling (docs/formats.md lists the fields)"
        guess = _did_you_mean(first, errors)
        if guess:
            msg = f"unknown field; did you mean `{guess}`?"
    elif first["type"] == "missing":
        msg = "required field is missing; add it (docs/formats.md)"
    elif first["type"] in ("int_parsing", "float_parsing") and isinstance(first["input"], str):
        msg = (
            f"{first['input']!r} is not a number; write a plain number without units "
            "(e.g. 16000000000 or 16e9 for bytes, 1.5e12 for FLOP/s)"
        )
    elif first["type"] == "int_from_float":
        msg = f"{first['input']!r} is not a whole number; give an integer"
    others = len(errors) - 1
    if first["type"] == "extra_forbidden" and _did_you_mean(first, errors):
        others -= 1  # the missing field the typo explains is not another problem
    more = f" (and {others} more)" if others > 0 else ""
    where = f"{source}: {loc}" if loc else source
    return f"{where}: {msg}{more}"


def _loc(parts: tuple[Any, ...]) -> str:
    loc = ""
    for part in parts:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    return loc


def _typo_first(errors: list[Any]) -> Any:
    """The error to show: an unknown field that looks like a missing one's typo comes first."""
    for err in errors:
        if err["type"] == "extra_forbidden" and _did_you_mean(err, errors):
            return err
    return errors[0]


def _did_you_mean(extra: Any, errors: list[Any]) -> str | None:
    """The missing field (same parent) that ``extra``'s name is closest to, if close."""
    parent, name = tuple(extra["loc"][:-1]), str(extra["loc"][-1])
    missing = [
        str(e["loc"][-1])
        for e in errors
        if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent
    ]
    close = difflib.get_close_matches(name, missing, n=1, cutoff=0.6)
    return close[0] if close else None


def read_document(path: Path | str, what: str = "file") -> Any:
    """Parse a YAML or JSON file (JSON is YAML) with one-line errors for every bad file.

    Refused: missing files, folders, empty or comment-only files, binary or non-UTF-8 text,
    duplicate keys, and NaN or infinite numbers (spec/strict.py).
    """
    p = Path(path)
    raw = parse_text(read_text(p, what), str(p), json_only=p.suffix == ".json")
    check_finite(raw, str(p))
    return raw


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
    check_booleans(kind, raw, source)
    try:
        # The source lets specs resolve files named relative to it (a job's model folder).
        spec = kind.model_validate(raw, context={**(context or {}), "source": source})
    except ValidationError as exc:
        raise SpecError(describe_validation_error(exc, source)) from None
    # Strings such as "nan" or "inf" pass pydantic's float parsing: refuse what they became.
    check_finite(spec.model_dump(), source)
    return spec


def load_spec(kind: type[SpecT], path: Path | str, context: dict[str, Any] | None = None) -> SpecT:
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
    plan = load_spec(Plan, path)
    if plan.format != PLAN_FORMAT:
        raise SpecError(
            f"{path}: format: unknown format {plan.format!r}; this version reads {PLAN_FORMAT!r}",
            field="format",
            fix="write the plan again with `orchestrator plan --out`",
        )
    return plan
