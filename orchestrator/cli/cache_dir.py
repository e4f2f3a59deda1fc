"""Where measured profiles are cached: ``--profile-cache``/``--cache``, else the user's cache.

The default is ``$XDG_CACHE_HOME/orchestrator/profiles`` (``~/.cache/...``). A home that cannot
be written (a read-only or missing ``HOME``, as on some batch systems and containers) falls back
to a folder of this user under the temp directory, with a note on stderr; a folder the user
named that cannot be written is a mistake (one line, exit code 2), found before anything starts.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from orchestrator.errors import UserError


def default_profile_cache() -> Path:
    """``$XDG_CACHE_HOME/orchestrator/profiles``, else ``~/.cache/orchestrator/profiles``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchestrator" / "profiles"


def fallback_profile_cache() -> Path:
    """This user's cache under the temp directory (kept between runs of one machine boot)."""
    return Path(tempfile.gettempdir()) / f"orchestrator-{os.getuid()}" / "profiles"


def _usable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def resolve_profile_cache(explicit: Path | None, flag: str) -> Path:
    """The cache folder to use, created; ``explicit`` must be usable, the default may fall back."""
    if explicit is not None:
        if explicit.exists() and not explicit.is_dir():
            raise UserError(
                f"{explicit} is a file, not a folder", field=flag, fix="give a folder for the cache"
            )
        if not _usable(explicit):
            raise UserError(
                f"cannot create or write the folder {explicit}",
                field=flag,
                fix="give a writable folder",
            )
        return explicit
    default = default_profile_cache()
    if _usable(default):
        return default
    fallback = fallback_profile_cache()
    if not _usable(fallback):
        raise UserError(
            f"neither {default} nor {fallback} can be written",
            field=flag,
            fix=f"pass {flag} DIR with a writable folder",
        )
    print(
        f"note: {default} is not writable; caching profiles in {fallback} "
        f"(pass {flag} DIR to choose)",
        file=sys.stderr,
        flush=True,
    )
    return fallback
