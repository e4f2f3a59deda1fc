"""Retrying a call that may fail transiently, with a bounded number of attempts.

kopf retries failing change handlers itself, but not event handlers (a Node watch event is handled
once), so node events are retried here: a few quick attempts, then the error is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from orchestrator.errors import TransientError

T = TypeVar("T")


def with_retries(
    call: Callable[[], T],
    *,
    attempts: int = 3,
    backoff_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``call``; on TransientError wait ``backoff_s`` (doubling each time) and retry.

    Gives up after ``attempts`` calls in all and re-raises the last TransientError.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    delay_s = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except TransientError:
            if attempt == attempts:
                raise
            sleep(delay_s)
            delay_s *= 2
    raise AssertionError("unreachable")
