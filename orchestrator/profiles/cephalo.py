"""Import Cephalo's per-layer latencies into the project's profile format.

Cephalo (benson-guo/cephalo, MIT) measured *one transformer layer* of each model on many GPU types.
``model_latencies.json`` is ``{model: {gpu: {seq: {dtype: ENTRY}}}}`` in milliseconds, where ENTRY
takes one of four shapes (all seen in the file):

1. ``[[fwd_slope, fwd_icpt], [bwd_slope, bwd_icpt], fwd_ms[b=1..N], bwd_ms[b=1..N]]``: linear
   fits in the batch size b plus the measured per-batch times;
2. ``[[fwd_slope, fwd_icpt], [bwd_slope, bwd_icpt]]``: the fits only;
3. ``[slope, icpt]``: one fit of forward + backward together;
4. ``slope``: forward + backward milliseconds per sample, no intercept.

A measured time is used where the batch was measured, the fit elsewhere. Combined figures (3, 4)
are split one third forward, two thirds backward: backward does twice the matrix work of forward
(the gradients with respect to inputs and to weights), the usual 1:2 rule (Narayanan et al.,
SC'21, section 3.5). A fit that gives a non-positive time at some batch is not used for it.

Blocks ``1..num_layers`` all get the one measured layer; the embedding (0) and the head
(``num_layers + 1``) are absent, so the cost model estimates them and says so. Cephalo measured
no optimizer update, so ``update_s`` is left out (null) and the cost model estimates it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.profiles.common import ImportResult, mapping, read_json, select_names
from orchestrator.profiles.names import (
    CEPHALO_DEVICES,
    CEPHALO_NOT_IN_CATALOG,
    CEPHALO_PREFERENCE,
)
from orchestrator.spec.devices import Dtype
from orchestrator.spec.profiles import LayerTiming, ProfileEntry, ProfileFile

CEPHALO_DTYPES = {Dtype.FP32: "float32", Dtype.FP16: "float16", Dtype.BF16: "bfloat16"}
DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
BACKWARD_SHARE_OF_COMBINED = 2.0 / 3.0  # backward = 2x forward, see the module docstring
MS = 1e-3


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def layer_times_ms(entry: Any, batch: int, where: str) -> tuple[float, float, str] | None:
    """(forward_ms, backward_ms, how) of one layer at ``batch`` samples, or None when the
    entry gives no positive time for it. ``how`` is measured, fit or combined fit."""
    if _number(entry):  # shape 4: combined slope
        total = float(entry) * batch
        return _split(total, "combined fit")
    if not isinstance(entry, list):
        raise SpecError(f"{where}: unrecognised entry {entry!r}", field=where)
    if len(entry) == 2 and all(_number(v) for v in entry):  # shape 3: combined fit
        return _split(entry[0] * batch + entry[1], "combined fit")
    if len(entry) in (2, 4) and all(isinstance(f, list) and len(f) == 2 for f in entry[:2]):
        if len(entry) == 4 and batch <= min(len(entry[2]), len(entry[3])):  # shape 1
            fwd, bwd = float(entry[2][batch - 1]), float(entry[3][batch - 1])
            return (fwd, bwd, "measured") if fwd > 0 and bwd > 0 else None
        fwd = entry[0][0] * batch + entry[0][1]
        bwd = entry[1][0] * batch + entry[1][1]
        return (float(fwd), float(bwd), "fit") if fwd > 0 and bwd > 0 else None
    raise SpecError(
        f"{where}: unrecognised entry of {len(entry)} items",
        field=where,
        fix="pass an unmodified Cephalo model_latencies.json (shapes in docs/formats.md)",
    )


def _split(total_ms: float, how: str) -> tuple[float, float, str] | None:
    if total_ms <= 0:
        return None
    bwd = total_ms * BACKWARD_SHARE_OF_COMBINED
    return (total_ms - bwd, bwd, how)


def convert_cephalo_entry(
    entry: Any,
    *,
    model: str,
    device_type: str,
    source: str,
    num_layers: int,
    sequence_length: int,
    dtype: Dtype,
    microbatch_sizes: list[int] | tuple[int, ...] = DEFAULT_MICROBATCH_SIZES,
    measured_as: str = "",
) -> tuple[ProfileFile | None, list[int]]:
    """Convert one GPU's entry into a profile of blocks ``1..num_layers``.

    Returns the profile (None if no microbatch size had a usable time) and the microbatch sizes
    skipped because the entry gave no positive time for them.
    """
    entries: list[ProfileEntry] = []
    skipped: list[int] = []
    hows: set[str] = set()
    for mbs in sorted(set(microbatch_sizes)):
        times = layer_times_ms(entry, mbs, source)
        if times is None:
            skipped.append(mbs)
            continue
        fwd_ms, bwd_ms, how = times
        hows.add(how)
        timing = LayerTiming(forward_s=fwd_ms * MS, backward_s=bwd_ms * MS)
        layers = {i: timing for i in range(1, num_layers + 1)}
        entries.append(ProfileEntry(microbatch_size=mbs, tp=1, layers=layers))
    if not entries:
        return None, skipped
    text = (
        f"Cephalo (benson-guo/cephalo, MIT) {source}: "
        f"one transformer layer ({', '.join(sorted(hows))}), "
        f"repeated for blocks 1..{num_layers}; embedding and head not measured (estimated); "
        "optimizer update not measured (update_s null)"
    )
    if measured_as:
        text += f"; measured on {measured_as}"
    profile = ProfileFile(
        model=model,
        device_type=device_type,
        sequence_length=sequence_length,
        dtype=dtype.value,
        source=text,
        entries=entries,
    )
    return profile, skipped


def _latencies_path(src: Path) -> Path:
    path = src / "model_latencies.json" if src.is_dir() else src
    if not path.is_file():
        raise SpecError(
            f"no such file: {path}",
            field="SRC",
            fix="pass Cephalo's model_latencies.json or the folder holding it",
        )
    return path


def _default_num_layers(latencies_path: Path, model: str) -> int:
    """Cephalo's model_stats.json, when it lies beside the latencies, knows the layer count."""
    stats_path = latencies_path.parent / "model_stats.json"
    if stats_path.is_file():
        stats = mapping(read_json(stats_path, "Cephalo model_stats.json"), str(stats_path))
        count = (
            stats.get(model, {}).get("num_layers") if isinstance(stats.get(model), dict) else None
        )
        if isinstance(count, int) and count > 0:
            return count
    raise SpecError(
        f"the layer count of {model!r} is unknown",
        field="--num-layers",
        fix="pass --num-layers N (the model's transformer blocks)",
    )


def _pick_gpus(by_gpu: dict[str, Any], gpus: list[str] | None, result: ImportResult) -> list[str]:
    """Source GPU names to convert: mapped ones, one per catalog type (CEPHALO_PREFERENCE)."""
    chosen = select_names(sorted(by_gpu), gpus, "--gpus")
    unmapped = [g for g in chosen if g not in CEPHALO_DEVICES]
    if unmapped and gpus is not None:
        raise SpecError(
            f"GPU names with no catalog entry: {', '.join(unmapped)}",
            field="--gpus",
            fix=f"choose among {', '.join(sorted(g for g in chosen if g in CEPHALO_DEVICES))}",
        )
    not_in_catalog = [g for g in unmapped if g in CEPHALO_NOT_IN_CATALOG]
    unknown = [g for g in unmapped if g not in CEPHALO_NOT_IN_CATALOG]
    if not_in_catalog:
        result.warnings.append(f"skipped GPUs the catalog lacks: {', '.join(not_in_catalog)}")
    if unknown:
        result.warnings.append(f"skipped unknown GPU names: {', '.join(unknown)}")
    order = {g: i for i, g in enumerate(CEPHALO_PREFERENCE)}
    mapped = sorted(
        (g for g in chosen if g in CEPHALO_DEVICES), key=lambda g: (order.get(g, -1), g)
    )
    return mapped


def import_cephalo(
    src: Path,
    *,
    model: str,
    sequence_length: int,
    dtype: Dtype,
    name: str | None = None,
    gpus: list[str] | None = None,
    num_layers: int | None = None,
    microbatch_sizes: list[int] | tuple[int, ...] = DEFAULT_MICROBATCH_SIZES,
) -> ImportResult:
    """Convert one Cephalo model at one sequence length and dtype, on every GPU that has it
    (or those in ``gpus``), into profiles named ``name`` (default: ``model``)."""
    path = _latencies_path(src)
    data = mapping(read_json(path, "Cephalo model_latencies.json"), str(path))
    if model not in data:
        raise SpecError(
            f"model {model!r} is not in {path.name}",
            field="--model",
            fix=f"choose among {', '.join(sorted(data))}",
        )
    layers = num_layers if num_layers is not None else _default_num_layers(path, model)
    by_gpu = mapping(data[model], f"{path.name}[{model}]")
    result = ImportResult()
    taken: dict[str, str] = {}  # catalog type -> source GPU name converted for it
    for gpu in _pick_gpus(by_gpu, gpus, result):
        device = CEPHALO_DEVICES[gpu]
        if device.device_type in taken:
            result.warnings.append(
                f"{gpu}: skipped, {device.device_type} already comes from "
                f"{taken[device.device_type]}"
            )
            continue
        entry = mapping(by_gpu[gpu], f"{model}[{gpu}]").get(str(sequence_length), {})
        entry = entry.get(CEPHALO_DTYPES[dtype]) if isinstance(entry, dict) else None
        if entry is None:
            _no_measurement(result, gpu, gpus, sequence_length, dtype, by_gpu[gpu])
            continue
        source = f"{path.name}[{model}][{gpu}][{sequence_length}][{CEPHALO_DTYPES[dtype]}]"
        profile, skipped = convert_cephalo_entry(
            entry,
            model=name or model,
            device_type=device.device_type,
            source=source,
            num_layers=layers,
            sequence_length=sequence_length,
            dtype=dtype,
            microbatch_sizes=microbatch_sizes,
            measured_as=device.measured_as,
        )
        if skipped:
            result.warnings.append(
                f"{gpu}: no positive time for microbatch sizes {skipped}, left out"
            )
        if profile is not None:
            taken[device.device_type] = gpu
            result.profiles.append(profile)
    if not result.profiles:
        raise SpecError(
            f"{model!r} has no usable measurement at sequence length {sequence_length}, "
            f"{dtype.value}, on a GPU the catalog knows",
            field="--sequence-length/--dtype",
            fix=f"choose among what the source has: {_available(by_gpu)}",
        )
    return result


def _no_measurement(
    result: ImportResult,
    gpu: str,
    requested: list[str] | None,
    sequence_length: int,
    dtype: Dtype,
    by_seq: Any,
) -> None:
    message = f"{gpu}: no measurement at sequence length {sequence_length}, {dtype.value}"
    if requested is not None:
        raise SpecError(
            message,
            field="--gpus",
            fix=f"it has {_available({gpu: by_seq})}; drop it or change flags",
        )
    result.warnings.append(message + ", skipped")


def _available(by_gpu: dict[str, Any]) -> str:
    """``512/float32, 1024/float16`` style list of (sequence length, dtype) pairs present."""
    pairs = {
        (int(seq), dt)
        for by_seq in by_gpu.values()
        if isinstance(by_seq, dict)
        for seq, by_dtype in by_seq.items()
        if isinstance(by_dtype, dict) and seq.isdigit()
        for dt in by_dtype
    }
    return ", ".join(f"{seq}/{dt}" for seq, dt in sorted(pairs)) or "(nothing)"
