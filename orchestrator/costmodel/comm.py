"""Communication times: point-to-point activations, ring all-reduce.

Ring all-reduce moves ``2 (n - 1) / n`` times the buffer through each rank's link (Patarasuk and
Yuan 2009; NCCL's ring algorithm), so its time is that volume over the slowest link in the ring.
"""

from __future__ import annotations

from orchestrator.spec.model import ModelSpec


def ring_allreduce_s(num_bytes: float, num_ranks: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds to all-reduce ``num_bytes`` among ``num_ranks`` over the given slowest link."""
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    return 2.0 * (num_ranks - 1) / num_ranks * num_bytes / bandwidth_bytes_per_s


def boundary_activation_bytes(model: ModelSpec, microbatch_size: int) -> float:
    """Bytes crossing a stage boundary for one microbatch: the hidden states ``[b, s, h]``."""
    return microbatch_size * model.sequence_length * model.hidden_size * model.dtype.size_bytes


def p2p_s(num_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds to send ``num_bytes`` from one device to another."""
    return num_bytes / bandwidth_bytes_per_s


def tp_allreduce_per_pass_s(
    model: ModelSpec, microbatch_size: int, tp: int, intra_node_bandwidth_bytes_per_s: float
) -> float:
    """Tensor-parallel all-reduce time of one block pass (Megatron: two per block and pass)."""
    if tp <= 1:
        return 0.0
    nbytes = boundary_activation_bytes(model, microbatch_size)
    return 2 * ring_allreduce_s(nbytes, tp, intra_node_bandwidth_bytes_per_s)
