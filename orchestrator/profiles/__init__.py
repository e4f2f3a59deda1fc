"""Per-layer profiles: importers from public formats and the profiles shipped with the package.

Pure Python (no torch or ray): :mod:`.sailor` and :mod:`.cephalo` convert the two public formats
into :class:`~orchestrator.spec.profiles.ProfileFile`; :mod:`.builtin` reads the converted copies
under ``orchestrator/data``.
"""

from orchestrator.profiles.builtin import (
    builtin_model,
    builtin_model_names,
    builtin_profiles,
)
from orchestrator.profiles.cephalo import import_cephalo
from orchestrator.profiles.common import ImportResult
from orchestrator.profiles.sailor import import_sailor

__all__ = [
    "ImportResult",
    "builtin_model",
    "builtin_model_names",
    "builtin_profiles",
    "import_cephalo",
    "import_sailor",
]
