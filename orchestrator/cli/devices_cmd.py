"""``orchestrator devices``: list the device catalog (built in, plus a cluster file's own types)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.spec.devices import DeviceCatalog

GIB = 1024**3
TERA = 1e12
GIGA = 1e9


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "devices",
        help="list the device catalog",
        description=(
            "List the device types the planner knows: memory, peak dense FLOP/s per dtype, memory "
            "and intra-node bandwidth (public datasheets). With --cluster, the file's own "
            "device_types are added or override built-in entries."
        ),
    )
    parser.add_argument(
        "--cluster", metavar="FILE", help="include this cluster file's device_types"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON array instead of a table"
    )
    parser.set_defaults(func=run_devices)


def catalog_rows(
    catalog: DeviceCatalog, from_file: set[str], builtin: set[str]
) -> list[dict[str, Any]]:
    """One dict per device type, in catalog order, with units in the keys."""
    from orchestrator.spec.devices import Dtype

    rows = []
    for d in catalog.all():
        origin = "built-in"
        if d.name in from_file:
            origin = "cluster file (overrides)" if d.name in builtin else "cluster file"
        rows.append(
            {
                "name": d.name,
                "memory_bytes": d.memory_bytes,
                "peak_flops_per_s": {dt.value: d.flops_per_s(dt) for dt in Dtype},
                "memory_bandwidth_bytes_per_s": d.memory_bandwidth_bytes_per_s,
                "intra_node_bandwidth_bytes_per_s": d.intra_node_bandwidth_bytes_per_s,
                "framework_overhead_bytes": d.framework_overhead_bytes,
                "description": d.description,
                "source": origin,
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table: GiB, TFLOP/s and GB/s, one device type a line."""
    header = (
        "name",
        "memory GiB",
        "fp32 TF/s",
        "fp16 TF/s",
        "bf16 TF/s",
        "mem GB/s",
        "intra GB/s",
        "source",
        "description",
    )
    lines = [header]
    for r in rows:
        flops = r["peak_flops_per_s"]
        lines.append(
            (
                r["name"],
                f"{r['memory_bytes'] / GIB:.1f}",
                f"{flops['fp32'] / TERA:g}",
                f"{flops['fp16'] / TERA:g}",
                f"{flops['bf16'] / TERA:g}",
                f"{r['memory_bandwidth_bytes_per_s'] / GIGA:g}",
                f"{r['intra_node_bandwidth_bytes_per_s'] / GIGA:g}",
                r["source"],
                r["description"],
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = range(1, 7)
    out = []
    for line in lines:
        cells = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def run_devices(args: argparse.Namespace) -> int:
    from orchestrator.spec.devices import BUILTIN_DEVICE_TYPES, DeviceCatalog
    from orchestrator.spec.loading import load_cluster

    builtin = {d.name for d in BUILTIN_DEVICE_TYPES}
    from_file: set[str] = set()
    if args.cluster:
        spec = load_cluster(args.cluster)
        spec.resolve()  # the same checks `plan` makes: unknown device types fail here too
        catalog = spec.catalog()
        from_file = {d.name for d in spec.device_types}
    else:
        catalog = DeviceCatalog.builtin()
    rows = catalog_rows(catalog, from_file, builtin)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
        print(
            "Peak dense figures from vendor datasheets; fp32 is non-tensor FP32. "
            "Parts without bf16 list their fp32 rate for bf16."
        )
    return 0
