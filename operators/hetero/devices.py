"""Device catalog names <-> ``nvidia.com/gpu.product``, the label GPU feature discovery sets.

The table holds the products a catalog type is usually sold as on cloud Kubernetes; a pool can name
its own product (``gpuProduct``) where a provider labels nodes differently.
"""

from __future__ import annotations

from orchestrator.spec import DeviceCatalog

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"

# Values of nvidia.com/gpu.product as GPU feature discovery writes them (spaces become dashes).
GPU_PRODUCT_BY_DEVICE_TYPE: dict[str, str] = {
    "H200": "NVIDIA-H200",
    "H100": "NVIDIA-H100-80GB-HBM3",
    "GH-96": "NVIDIA-GH200-480GB",
    "A100-80": "NVIDIA-A100-SXM4-80GB",
    "A100-40": "NVIDIA-A100-SXM4-40GB",
    "L40S": "NVIDIA-L40S",
    "A10G": "NVIDIA-A10G",
    "A6000": "NVIDIA-RTX-A6000",
    "L4": "NVIDIA-L4",
    "T4": "Tesla-T4",
    "V100-32": "Tesla-V100-SXM2-32GB",
    "V100-16": "Tesla-V100-SXM2-16GB",
}

# Products that differ from the table only by form factor map back to the same catalog type.
_EXTRA_PRODUCTS: dict[str, str] = {
    "NVIDIA-A100-80GB-PCIe": "A100-80",
    "NVIDIA-A100-PCIE-40GB": "A100-40",
    "NVIDIA-H100-PCIe": "H100",
    "NVIDIA-H100-NVL": "H100",
    "Tesla-V100-PCIE-32GB": "V100-32",
    "Tesla-V100-PCIE-16GB": "V100-16",
}

DEVICE_TYPE_BY_GPU_PRODUCT: dict[str, str] = {
    **{product: name for name, product in GPU_PRODUCT_BY_DEVICE_TYPE.items()},
    **_EXTRA_PRODUCTS,
}


def known_device_types() -> list[str]:
    """Catalog names a pool may use without naming its own ``gpuProduct``."""
    catalog = DeviceCatalog.builtin()
    return [name for name in catalog.names() if name in GPU_PRODUCT_BY_DEVICE_TYPE]


def gpu_product_for(device_type: str) -> str | None:
    """The ``nvidia.com/gpu.product`` value of a catalog type, or None where the table has none."""
    return GPU_PRODUCT_BY_DEVICE_TYPE.get(device_type)


def device_type_for_product(
    product: str | None, overrides: dict[str, str] | None = None
) -> str | None:
    """The catalog name of a node's GPU product (``overrides``: product -> type from the pools)."""
    if product is None:
        return None
    if overrides and product in overrides:
        return overrides[product]
    return DEVICE_TYPE_BY_GPU_PRODUCT.get(product)
