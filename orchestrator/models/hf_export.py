"""Write trained planner layers back as a Hugging Face model folder.

The folder holds the source's ``config.json`` (and its tokenizer files, if any) and one
``model.safetensors`` with the model's own parameter names, so
``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` loads it. A tied head is written once
(as the embedding), as the library expects. The folder is written beside its destination and
renamed into place, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from orchestrator.errors import SpecError
from orchestrator.models.hf_causal import HFCausalLM
from orchestrator.worker.tied import tied_copies

# Files of a model folder that describe the tokenizer and generation, copied as they are.
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)


def hf_state_dict(model: HFCausalLM, layer_params: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Planner layer -> local state dict, to one state dict under the model's own names."""
    missing = [i for i in range(model.num_planner_layers) if i not in layer_params]
    if missing:
        raise SpecError(
            f"the trained states lack planner layers {missing} of {model.name!r}",
            field="checkpoint",
            fix="export a whole checkpoint of this model",
        )
    copies = tied_copies(model)
    out: dict[str, Any] = {}
    for i in range(model.num_planner_layers):
        params = layer_params[i]
        names = model.hf_names(i, list(params))
        for local, tensor in params.items():
            if (i, local) in copies:
                continue
            out[names[local]] = tensor.detach().to("cpu").contiguous()
    return out


def export_hf(
    model: HFCausalLM, layer_params: dict[int, dict[str, Any]], out_dir: Path | str
) -> Path:
    """Write ``out_dir`` (which must not exist yet) as a Hugging Face folder; returns it."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    if out.exists():
        raise SpecError(
            f"{out} already exists", field="--out", fix="choose a new folder for the export"
        )
    state = hf_state_dict(model, layer_params)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        save_file(
            {k: v.to(torch.float32) for k, v in state.items()},
            str(staging / "model.safetensors"),
            metadata={"format": "pt"},
        )
        shutil.copy2(model.folder / "config.json", staging / "config.json")
        for name in SIDE_FILES:
            if (model.folder / name).is_file():
                shutil.copy2(model.folder / name, staging / name)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def export_checkpoint(
    model_folder: Path | str,
    checkpoint_root: Path | str,
    out_dir: Path | str,
    sequence_length: int = 1,
) -> tuple[Path, int]:
    """Export the newest good checkpoint under ``checkpoint_root``; returns (folder, step)."""
    from orchestrator.worker.checkpoint import load_latest

    checkpoint = load_latest(Path(checkpoint_root))
    if checkpoint is None:
        raise SpecError(
            f"no checkpoint under {checkpoint_root}",
            field="--checkpoint",
            fix="point to the job's checkpoint.dir",
        )
    model = HFCausalLM(model_folder, sequence_length, pretrained=False)
    params = {i: s["params"] for i, s in checkpoint.layer_states.items()}
    return export_hf(model, params, out_dir), checkpoint.step
