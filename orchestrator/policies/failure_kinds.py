"""What kind of failure an error from a training step is: a lost peer, out of memory, or a bug.

Worker errors reach the controller as exceptions whose type name and message are all that
survive the trip between processes (the runtime wraps them as ``"<Type>: <message>"``), so the
classification reads text:

- **out of memory**: PyTorch's ``OutOfMemoryError`` ("CUDA out of memory ..."), Python's
  ``MemoryError``, Ray's ``OutOfMemoryError`` (the host's memory monitor killed the worker). Not
  fatal: the device type's usable memory is lowered to what the error measured and the run
  re-plans. PyTorch's message says how much this process held when the allocation failed ("this
  process has 77.85 GiB memory in use"); that is the usable figure.
- **lost peer**: a collective that timed out or whose connection broke (gloo's "Connection closed
  by peer", "Broken pipe", "Connection reset by peer", NCCL's watchdog timeout or an aborted
  communicator, ``DistNetworkError`` / ``DistBackendError``): a peer died or the network dropped
  it; the run recovers as from a lost worker.
- **user code**: anything else raised by the model or the data. Retrying would raise it again: the
  run fails with the worker's traceback text and the checkpoint to resume from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

GIB = 1024**3
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": GIB, "TiB": 1024**4}


class FailureKind(StrEnum):
    LOST_PEER = "lost_peer"
    OUT_OF_MEMORY = "out_of_memory"
    USER_CODE = "user_code"


@dataclass(frozen=True)
class ClassifiedFailure:
    kind: FailureKind
    detail: str
    # Out of memory: bytes the process held when it ran out (None when the message lacks it).
    measured_usable_bytes: float | None = None
    host: bool = False  # host memory (not the accelerator's)


_OOM = re.compile(
    r"OutOfMemoryError|CUDA out of memory|HIP out of memory|\bMemoryError\b|"
    r"out of memory|Task was killed due to the node running low on memory",
    re.IGNORECASE,
)
_HOST_OOM = re.compile(r"\bMemoryError\b|running low on memory|host", re.IGNORECASE)
_LOST_PEER = re.compile(
    r"Connection closed by peer|Broken pipe|Connection reset by peer|ECONNRESET|EPIPE|"
    r"DistNetworkError|DistBackendError|NCCL communicator was aborted|"
    r"Watchdog caught collective operation timeout|"
    r"(gloo|nccl|collective|allreduce|all_reduce|barrier|recv|send)\b[^\n]*timed? ?out|"
    r"timed? ?out[^\n]*\b(gloo|nccl|collective|allreduce|all_reduce|barrier|recv|send)",
    re.IGNORECASE,
)
_IN_USE = re.compile(r"this process has ([\d.]+) (B|KiB|MiB|GiB|TiB) memory in use")
_CAPACITY = re.compile(
    r"total capacity of ([\d.]+) (B|KiB|MiB|GiB|TiB) of which ([\d.]+) (B|KiB|MiB|GiB|TiB) is free"
)


def classify_failure(error: BaseException | str) -> ClassifiedFailure:
    """The kind of ``error`` (an exception from a step, or its text)."""
    full = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    # The error's own line, not the traceback after it: the source lines of a traceback (a call
    # of all_reduce with a timeout argument, say) must not decide the kind.
    text = full.split("\n", 1)[0]
    if _OOM.search(text):
        return ClassifiedFailure(
            FailureKind.OUT_OF_MEMORY,
            full,
            measured_usable_bytes=_measured_usable(text),
            host=bool(_HOST_OOM.search(text)) and "CUDA" not in text,
        )
    if _LOST_PEER.search(text):
        return ClassifiedFailure(FailureKind.LOST_PEER, full)
    return ClassifiedFailure(FailureKind.USER_CODE, full)


def _measured_usable(text: str) -> float | None:
    in_use = _IN_USE.search(text)
    if in_use:
        return float(in_use.group(1)) * _UNITS[in_use.group(2)]
    capacity = _CAPACITY.search(text)
    if capacity:
        total = float(capacity.group(1)) * _UNITS[capacity.group(2)]
        free = float(capacity.group(3)) * _UNITS[capacity.group(4)]
        return total - free
    return None
