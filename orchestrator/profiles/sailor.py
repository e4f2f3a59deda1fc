"""Import Sailor's per-layer profiles into the project's profile format.

Sailor (eth-easl/sailor, MIT) measured every layer of a Megatron-DeepSpeed model on real GPUs:

* ``profiles/<MODEL>/<GPU>/profile.json``: ``{mbs: {tp: {layer: [fwd_s, bwd_s, update_s]}}}``,
  keys are strings, layer 0 is the embedding, the last layer the head (the planner's indexing).
* ``llm_info.json``: ``{model: {tp: {layer: {params_floats, act_mem_floats, ...}}}}``, counts of
  numbers per tensor-parallel rank for *one* sample (``act_output_floats`` of a block is exactly
  ``sequence_length * hidden_size``).

Sailor's ``update_s`` is the same figure on every layer: it is the optimizer step of a pipeline
stage, which Sailor's simulator reads once per stage (at the stage's first layer), never summed
over layers. The importer keeps it once, as the entry's ``stage_update_s``, and gives the layers an
``update_s`` of 0. A profile whose updates are all 0 (not measured) gets ``update_s`` null, so the
cost model estimates the update.

Memory: ``param_bytes = params_floats * dtype bytes`` (the layer's weights on one tp rank).
Activations are *not* taken from ``act_mem_floats`` as bytes. Megatron's activation memory is
Korthikanti et al.'s formula (measured on Megatron itself, ``costmodel/memory.py``): 4.5 B per
counted unit for OPT-350's blocks (tp 1), 5.0 B (tp 1) to 4.2 B (tp 4) for GPT-Neo-2.7's, and the
measured GPT-Neo runs on GH200 rise by 4.2 B per unit at tp 4, as the formula says; 2 B per unit
(one fp16 number each) under-counts by more than half. The ratio is not one constant (the count
weighs the attention scores and the other activations differently), so the profiles carry no
activation bytes and the cost model applies the formula. ``llm_info.json``'s own ``*_bytes`` fields
count 4 bytes per number whatever the training dtype, so they are not used either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.profiles.common import (
    ImportResult,
    int_key,
    mapping,
    read_json,
    seconds,
    select_names,
)
from orchestrator.profiles.names import SAILOR_DEVICES
from orchestrator.spec.devices import Dtype
from orchestrator.spec.profiles import LayerTiming, ProfileEntry, ProfileFile

# Megatron-DeepSpeed as Sailor ran it trains in fp16 mixed precision.
SAILOR_DEFAULT_DTYPE = Dtype.FP16


def _layer_timing(
    value: Any, where: str, memory: dict[str, Any] | None, dtype: Dtype, per_stage: bool
) -> LayerTiming:
    if not isinstance(value, list) or len(value) != 3:
        raise SpecError(
            f"{where}: expected [forward_s, backward_s, update_s], got {value!r}",
            field=where,
            fix="pass an unmodified Sailor profile.json",
        )
    fwd_s, bwd_s, _stage_update_s = (seconds(v, where) for v in value)
    param_bytes = None
    if memory is not None:
        param_bytes = int(memory["params_floats"]) * dtype.size_bytes
    return LayerTiming(
        forward_s=fwd_s,
        backward_s=bwd_s,
        # The stage's update is kept once on the entry (module docstring); None: not measured.
        update_s=0.0 if per_stage else None,
        param_bytes=param_bytes,
    )


def _stage_update_s(raw_layers: dict[str, Any], where: str) -> float | None:
    """The stage's optimizer seconds: the figure at the first layer (as Sailor's simulator reads
    it), or None when the source measured none (every figure 0)."""
    ordered = sorted(raw_layers.items(), key=lambda kv: int_key(kv[0], where))
    figures = [v[2] for _, v in ordered if isinstance(v, list) and len(v) == 3]
    if not figures or not any(figures):
        return None
    return seconds(figures[0], f"{where}[{ordered[0][0]}]")


def _memory_of(llm_info_model: dict[str, Any] | None, tp: int, layer: int) -> dict[str, Any] | None:
    if llm_info_model is None:
        return None
    per_layer = llm_info_model.get(str(tp), {}).get(str(layer))
    if not isinstance(per_layer, dict) or not {"params_floats", "act_mem_floats"} <= set(per_layer):
        return None
    return per_layer


def convert_sailor_profile(
    raw: Any,
    *,
    model: str,
    device_type: str,
    source: str,
    llm_info_model: dict[str, Any] | None = None,
    dtype: Dtype = SAILOR_DEFAULT_DTYPE,
    sequence_length: int | None = None,
    num_layers: int | None = None,
    microbatch_sizes: list[int] | None = None,
) -> ProfileFile:
    """Convert one parsed ``profile.json`` (one model on one GPU type) into a ProfileFile.

    ``num_layers`` (transformer blocks), when given, is checked: the profile must hold planner
    layers ``0 .. num_layers + 1`` and nothing beyond. ``microbatch_sizes`` keeps only those.
    """
    entries: list[ProfileEntry] = []
    for mbs_key, by_tp in sorted(
        mapping(raw, source).items(), key=lambda kv: int_key(kv[0], source)
    ):
        mbs = int_key(mbs_key, source)
        if mbs == 0:
            raise SpecError(f"{source}: microbatch size 0", field=f"{source}[{mbs_key}]")
        if microbatch_sizes is not None and mbs not in microbatch_sizes:
            continue
        for tp_key, by_layer in sorted(mapping(by_tp, f"{source}[{mbs_key}]").items()):
            tp = int_key(tp_key, f"{source}[{mbs_key}]")
            where = f"{source}[{mbs_key}][{tp_key}]"
            raw_layers = mapping(by_layer, where)
            stage_update_s = _stage_update_s(raw_layers, where)
            layers: dict[int, LayerTiming] = {}
            for layer_key, value in raw_layers.items():
                layer = int_key(layer_key, where)
                memory = _memory_of(llm_info_model, tp, layer)
                layers[layer] = _layer_timing(
                    value, f"{where}[{layer_key}]", memory, dtype, stage_update_s is not None
                )
            if num_layers is not None:
                _check_layer_count(layers, num_layers, where)
            if layers and tp > 0:
                entries.append(
                    ProfileEntry(
                        microbatch_size=mbs,
                        tp=tp,
                        layers=dict(sorted(layers.items())),
                        stage_update_s=stage_update_s,
                    )
                )
    if not entries:
        raise SpecError(
            f"{source}: no measurements left for microbatch sizes {microbatch_sizes}",
            field="--microbatch-sizes",
            fix="list sizes the source measured, or leave the flag out",
        )
    entries.sort(key=lambda e: (e.microbatch_size, e.tp))
    return ProfileFile(
        model=model,
        device_type=device_type,
        sequence_length=sequence_length,
        dtype=dtype.value,
        source=_describe_source(source, llm_info_model is not None, dtype),
        entries=entries,
    )


def _check_layer_count(layers: dict[int, LayerTiming], num_layers: int, where: str) -> None:
    expected = num_layers + 2
    if sorted(layers) != list(range(expected)):
        raise SpecError(
            f"{where}: has planner layers {min(layers)}..{max(layers)} ({len(layers)} layers), "
            f"but --num-layers {num_layers} means {expected} (embedding, blocks, head)",
            field="--num-layers",
            fix=f"pass --num-layers {len(layers) - 2} or the profile of the right model",
        )


def _describe_source(source: str, has_memory: bool, dtype: Dtype) -> str:
    text = f"Sailor (eth-easl/sailor, MIT) {source}: measured forward, backward, update seconds"
    if has_memory:
        text += (
            f"; parameter bytes from llm_info.json: params_floats x {dtype.size_bytes} B "
            "(activations: the cost model's formula)"
        )
    else:
        text += "; no memory figures (estimated by the cost model)"
    return text + "; the update is a stage's optimizer step (stage_update_s, once per stage)"


def import_sailor(
    src: Path,
    *,
    model: str | None = None,
    name: str | None = None,
    gpus: list[str] | None = None,
    dtype: Dtype = SAILOR_DEFAULT_DTYPE,
    sequence_length: int | None = None,
    num_layers: int | None = None,
    microbatch_sizes: list[int] | None = None,
) -> ImportResult:
    """Convert Sailor profiles under ``src`` (the folder holding ``profiles/``, and optionally
    ``llm_info.json``). ``model`` picks one model (default: every model found); ``name`` renames
    it in the output; ``gpus`` picks GPU folders. GPU folders with no catalog name are skipped
    with a warning."""
    profiles_dir = src / "profiles"
    if not profiles_dir.is_dir():
        raise SpecError(
            f"{src} has no profiles/ folder",
            field="SRC",
            fix="pass the Sailor data folder that holds profiles/<MODEL>/<GPU>/profile.json",
        )
    models = sorted(p.name for p in profiles_dir.iterdir() if p.is_dir())
    chosen = select_names(models, [model] if model else None, "--model")
    if name and len(chosen) != 1:
        raise SpecError("--name renames one model", field="--name", fix="pass --model too")
    llm_info = _read_llm_info(src / "llm_info.json")
    result = ImportResult()
    if llm_info is None:
        result.warnings.append(f"{src / 'llm_info.json'} not found: profiles carry no memory")
    for model_name in chosen:
        _import_model(
            profiles_dir / model_name,
            name or model_name,
            llm_info,
            gpus,
            result,
            dtype=dtype,
            sequence_length=sequence_length,
            num_layers=num_layers,
            microbatch_sizes=microbatch_sizes,
        )
    if not result.profiles:
        raise SpecError(
            f"nothing to import from {src}",
            field="SRC",
            fix="check --model and --gpus against the source (warnings above say what was skipped)",
        )
    return result


def _read_llm_info(path: Path) -> dict[str, Any] | None:
    return mapping(read_json(path, "Sailor llm_info.json"), str(path)) if path.is_file() else None


def _import_model(
    model_dir: Path,
    out_name: str,
    llm_info: dict[str, Any] | None,
    gpus: list[str] | None,
    result: ImportResult,
    **options: Any,
) -> None:
    available = sorted(p.name for p in model_dir.iterdir() if (p / "profile.json").is_file())
    chosen = select_names(available, gpus, "--gpus")
    unknown = [g for g in chosen if g not in SAILOR_DEVICES]
    if unknown and gpus is not None:
        raise SpecError(
            f"GPU names with no catalog entry: {', '.join(unknown)}",
            field="--gpus",
            fix=f"choose among {', '.join(sorted(SAILOR_DEVICES))}",
        )
    if unknown:
        result.warnings.append(
            f"{model_dir.name}: skipped GPU folders with no catalog name: {', '.join(unknown)}"
        )
    model_info = llm_info.get(model_dir.name) if llm_info is not None else None
    if llm_info is not None and model_info is None:
        result.warnings.append(f"{model_dir.name}: not in llm_info.json, profiles carry no memory")
    for gpu in chosen:
        if gpu in unknown:
            continue
        rel = f"profiles/{model_dir.name}/{gpu}/profile.json"
        raw = read_json(model_dir / gpu / "profile.json", "Sailor profile.json")
        result.profiles.append(
            convert_sailor_profile(
                raw,
                model=out_name,
                device_type=SAILOR_DEVICES[gpu].device_type,
                source=rel,
                llm_info_model=model_info,
                **options,
            )
        )
