"""A local cluster's private Ray root also holds its emulated devices' shared reference times."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.runtime.local_ray import PrivateRayEnv
from orchestrator.worker.emulation import SHARED_REFERENCES_ENV


def test_a_local_cluster_shares_reference_times_unless_a_folder_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SHARED_REFERENCES_ENV, raising=False)
    env = PrivateRayEnv(str(tmp_path))
    assert os.environ[SHARED_REFERENCES_ENV].startswith(str(tmp_path))
    env.restore()
    assert SHARED_REFERENCES_ENV not in os.environ
    # a folder the caller named (a benchmark's, one per side) is left as it is
    monkeypatch.setenv(SHARED_REFERENCES_ENV, "/elsewhere")
    env = PrivateRayEnv(str(tmp_path))
    assert os.environ[SHARED_REFERENCES_ENV] == "/elsewhere"
    env.restore()
    assert os.environ[SHARED_REFERENCES_ENV] == "/elsewhere"
