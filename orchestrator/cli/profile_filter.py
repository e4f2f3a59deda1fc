"""Profiles given on the command line that do not match the model are ignored, never silently.

A profile measured for another model, sequence length or dtype would mislead the cost model;
each such file is left out with a warning on stderr that names the file and the reason. A file
for this model that names a layer the model does not have is refused (it describes some other
model of the same name).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.spec.model import ModelSpec
from orchestrator.spec.profiles import (
    ProfileFile,
    ProfileSet,
    check_layer_range,
    mismatch,
    read_profile,
)


def profiles_for_model(
    paths: Sequence[Path], model: ModelSpec, warn: Callable[[str], None] | None = None
) -> ProfileSet:
    """The profiles under ``paths`` (validated as ProfileSet.load does) that fit ``model``."""
    ProfileSet.load(list(paths))  # every refusal: missing, empty folder, conflicts, bad files
    say = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    kept: list[ProfileFile] = []
    for root in paths:
        for path in sorted(root.rglob("*.json")) if root.is_dir() else [root]:
            profile = read_profile(path)
            reason = mismatch(profile, model)
            if reason is None:
                check_layer_range(profile, path, model.num_planner_layers)
                kept.append(profile)
            else:
                say(f"warning: {path} ignored: {reason}")
    return ProfileSet(kept)
