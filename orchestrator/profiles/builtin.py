"""Models and profiles shipped with the package (``orchestrator/data``), read as package data.

``builtin_model("OPT-350")`` is the model file ``data/models/opt-350.yaml``;
``builtin_profiles("OPT-350")`` every converted profile of that model under ``data/profiles``
(see ``data/profiles/README.md`` for their sources).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

import yaml
from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec.loading import describe_validation_error, parse_spec
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.profiles import ProfileFile, ProfileSet


def _data_dir(*parts: str) -> Traversable:
    # orchestrator/data is package data of ``orchestrator`` (no __init__.py), so start there.
    root = resources.files("orchestrator").joinpath("data")
    for part in parts:
        root = root.joinpath(part)
    return root


def _files(folder: Traversable, suffix: str) -> list[Traversable]:
    """Files with ``suffix`` under ``folder``, recursively, in a fixed (name) order."""
    found: list[Traversable] = []
    if not folder.is_dir():
        return found
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            found.extend(_files(entry, suffix))
        elif entry.name.endswith(suffix):
            found.append(entry)
    return found


@cache
def _models() -> dict[str, ModelSpec]:
    models: dict[str, ModelSpec] = {}
    for entry in _files(_data_dir("models"), ".yaml"):
        spec = parse_spec(ModelSpec, yaml.safe_load(entry.read_text()), f"models/{entry.name}")
        models[spec.name] = spec
    return models


@cache
def _profiles() -> tuple[ProfileFile, ...]:
    files: list[ProfileFile] = []
    for entry in _files(_data_dir("profiles"), ".json"):
        try:
            files.append(ProfileFile.model_validate(json.loads(entry.read_text())))
        except ValidationError as exc:  # a packaging bug, but say which file
            raise SpecError(describe_validation_error(exc, f"profiles/{entry.name}")) from None
    return tuple(files)


def builtin_model_names() -> list[str]:
    """Names of the shipped model files, sorted."""
    return sorted(_models())


def builtin_model(name: str) -> ModelSpec:
    """The shipped model called ``name``; SpecError naming the choices if there is none."""
    models = _models()
    if name not in models:
        raise SpecError(
            f"no built-in model {name!r}",
            field="model",
            fix=f"choose among {', '.join(sorted(models))} or pass a model file",
        )
    return models[name]


def builtin_profiles(model_name: str | None = None) -> ProfileSet:
    """The shipped profiles of ``model_name`` (all of them when None); empty if it has none."""
    files = [f for f in _profiles() if model_name is None or f.model == model_name]
    return ProfileSet(files)
