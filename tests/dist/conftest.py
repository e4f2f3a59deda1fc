"""The torch.distributed tests run real gloo process groups: one spawned process per rank on
loopback (``orchestrator.worker.local.run_local``); no Ray is involved.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # The reference runs in this process; keep it from fighting the spawned ranks for cores.
    torch.set_num_threads(1)
