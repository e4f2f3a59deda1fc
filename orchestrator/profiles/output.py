"""Writing converted profiles: every file to a temporary name first, then renamed into place."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from orchestrator.spec.profiles import ProfileFile


def profile_filename(profile: ProfileFile) -> str:
    """``<device_type>.json``; one file per (model, device type) under the model's folder."""
    return f"{profile.device_type}.json"


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def write_profiles(profiles: list[ProfileFile], out_dir: Path) -> list[Path]:
    """Write each profile to ``out_dir/<model>/<device_type>.json``; return the paths written."""
    written: list[Path] = []
    for profile in sorted(profiles, key=lambda p: (p.model, p.device_type)):
        path = out_dir / profile.model / profile_filename(profile)
        write_text_atomic(path, profile.to_json())
        written.append(path)
    return written
