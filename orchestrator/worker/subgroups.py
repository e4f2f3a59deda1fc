"""Every process group this process built beyond the world group, so leaving destroys each.

The engine's groups (gradient, tied, shard holders, tensor-parallel meshes) are all made by
:func:`new_group` here, which remembers the ones this rank belongs to. :func:`leave_world`
destroys them, newest first, and then the world group. Why each one by name: a subgroup stays
referenced after the world is gone (a tensor-parallel mesh lives in the layers' DTensor
parameters, which a re-formation or an export keeps), and whether ``destroy_process_group()`` of
the world shuts the subgroups' backends down as well differs between torch releases; a subgroup
left alive keeps its NCCL communicator, one more on every re-formation. Destroyed explicitly,
each communicator is shut down whoever still holds the Python object, and the old group can no
longer be looked up (``get_process_group_ranks`` raises, a mesh over it cannot resolve it).

Every rank creates the groups in the same order (``new_group`` is collective over the world),
so the members of a group destroy it in the same order too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

_created: list[dist.ProcessGroup] = []


def new_group(ranks: Sequence[int]) -> Any:
    """``torch.distributed.new_group(ranks)`` (collective over the world), remembered for
    :func:`destroy_all` when this rank is a member (a non-member gets torch's non-member mark,
    which holds nothing)."""
    handle = dist.new_group(ranks=list(ranks))
    if isinstance(handle, dist.ProcessGroup):
        _created.append(handle)
    return handle


def live() -> tuple[dist.ProcessGroup, ...]:
    """The subgroups built and not destroyed yet, oldest first."""
    return tuple(_created)


def destroy_all() -> int:
    """Destroy every remembered subgroup still known to torch, newest first; how many were
    destroyed (a group already gone, with a world destroyed elsewhere, is only forgotten)."""
    groups = list(_created)
    _created.clear()
    destroyed = 0
    for group in reversed(groups):
        try:
            dist.destroy_process_group(group)
        except (ValueError, KeyError, RuntimeError):
            continue  # not registered any more: destroyed with its world
        destroyed += 1
    return destroyed


def leave_world() -> None:
    """Destroy the subgroups, then the world group (safe to call twice)."""
    if dist.is_initialized():
        destroy_all()
        dist.destroy_process_group()
    else:
        _created.clear()
