"""A worker that raises: the group's error carries the worker's traceback (no Ray cluster needed:
the error handling reads only the exception Ray hands back)."""

from __future__ import annotations

import types

import pytest
from ray.exceptions import RayTaskError

from orchestrator.runtime.errors import WorkerFailedError
from orchestrator.runtime.group import WorkerGroup


def test_a_raising_worker_s_traceback_reaches_the_error():
    remote = (
        "Traceback (most recent call last):\n  File \"model.py\", line 3, in forward\nKeyError: 'x'"
    )
    exc = RayTaskError("step", remote, KeyError("x"))
    group = types.SimpleNamespace(_raise_lost=lambda *args, **kwargs: None)
    with pytest.raises(WorkerFailedError) as caught:
        WorkerGroup._raise_failure(group, "step", 2, exc)  # type: ignore[arg-type]
    text = str(caught.value)
    assert text.startswith("step: rank 2 failed: KeyError: 'x'")
    assert 'File "model.py", line 3, in forward' in text
