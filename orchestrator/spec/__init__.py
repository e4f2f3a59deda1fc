"""Nouns: device types, clusters, models, training settings, profiles and plans.

Pure data with validation; no ray, torch, kubernetes or prometheus_client.
"""

from orchestrator.spec.cluster import Cluster, ClusterSpec, Node, NodeGroupSpec
from orchestrator.spec.devices import DeviceCatalog, DeviceType, Dtype
from orchestrator.spec.model import LayerKind, ModelSpec, Optimizer, TrainingSpec
from orchestrator.spec.plan import Plan, ReplicaSpec, Sharding, StageSpec
from orchestrator.spec.profiles import LayerTiming, ProfileEntry, ProfileFile, ProfileSet

__all__ = [
    "Cluster",
    "ClusterSpec",
    "DeviceCatalog",
    "DeviceType",
    "Dtype",
    "LayerKind",
    "LayerTiming",
    "ModelSpec",
    "Node",
    "NodeGroupSpec",
    "Optimizer",
    "Plan",
    "ProfileEntry",
    "ProfileFile",
    "ProfileSet",
    "ReplicaSpec",
    "Sharding",
    "StageSpec",
    "TrainingSpec",
]
