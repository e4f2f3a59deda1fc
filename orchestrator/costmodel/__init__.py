"""Numbers: per-layer compute, communication, memory, step-time estimates and physical bounds.

Pure functions over spec values; no ray, torch, kubernetes or prometheus_client.
"""

from orchestrator.costmodel.bound import FluidBound, fluid_bound
from orchestrator.costmodel.estimate import (
    DeviceEstimate,
    Estimate,
    estimate_plan,
    estimate_with_tables,
)
from orchestrator.costmodel.tables import CostTables, LayerTable

__all__ = [
    "CostTables",
    "DeviceEstimate",
    "Estimate",
    "FluidBound",
    "LayerTable",
    "estimate_plan",
    "estimate_with_tables",
    "fluid_bound",
]
