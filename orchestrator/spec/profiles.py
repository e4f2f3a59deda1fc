"""Measured per-layer profiles: the planner's own format.

One :class:`ProfileFile` holds one (model, device type): for each (microbatch size, tensor-parallel
degree) the forward, backward and optimizer-update seconds of every planner layer, and optionally
its memory. Files are JSON (``orchestrator-profile/v1``); see docs/formats.md. A
:class:`ProfileSet` looks entries up; where it has none, the cost model falls back to an analytic
estimate and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
)

from orchestrator.errors import SpecError
from orchestrator.spec.model import ModelSpec

PROFILE_FORMAT = "orchestrator-profile/v1"


class LayerTiming(BaseModel):
    """One planner layer at one (microbatch size, tp): seconds and, if measured, bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    forward_s: NonNegativeFloat
    backward_s: NonNegativeFloat
    # None: not measured (the cost model then estimates the optimizer update).
    update_s: NonNegativeFloat | None = None
    # Activation bytes kept for backward per microbatch, and parameter bytes, when measured.
    activation_bytes: int | None = Field(default=None, ge=0)
    param_bytes: int | None = Field(default=None, ge=0)
    # The same activations under 16-bit autocast (bf16/fp16 compute over fp32 weights), without
    # autocast's weight copies, the layer's input in fp32 (the residual stream as the embedding
    # leaves it) and, ``..._boundary``, in 16 bits (as a stage receives it from its predecessor,
    # after which the stage's residual stream stays 16-bit); None: not measured.
    activation_bytes_16bit: int | None = Field(default=None, ge=0)
    activation_bytes_16bit_boundary: int | None = Field(default=None, ge=0)


class ProfileEntry(BaseModel):
    """Planner layers at one (microbatch size, tp), keyed by planner layer index.

    A layer may be missing (a source that measured only the transformer blocks, say); the cost model
    then estimates it analytically and reports it as estimated.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    microbatch_size: PositiveInt
    tp: PositiveInt = 1
    layers: dict[int, LayerTiming] = Field(min_length=1)
    # Optimizer seconds of one pipeline stage, charged once per stage whatever layers it holds (a
    # source that measured the step of a stage rather than of each layer); the layers' own
    # ``update_s`` then holds 0. None: per-layer figures only.
    stage_update_s: NonNegativeFloat | None = None


class RuntimeConstants(BaseModel):
    """Per-device constants of our runtime, measured by the profiler where it profiled.

    ``framework_bytes``: what a worker occupies before any model state (CUDA: the context outside
    the caching allocator, cuBLAS workspaces included; CPU: the process's resident memory).
    ``state_bytes_per_param``: weights + gradients + optimizer state per parameter, counted on
    the profiled layers after an update with ``optimizer`` (``worker/memory_account.py``).

    Time terms a running rank pays outside the per-layer pieces (``worker/runtime_terms.py``;
    None: not measured, the cost model then charges none): ``microbatch_overhead_s``, seconds
    per microbatch and stage (scheduling the pieces, reading the loss back, the emulated stretch
    waking up late); ``step_overhead_s``, seconds per step on the rank (clearing gradients, the
    optimizer loop); ``round_trip_s``, seconds the driver's call of a step costs beyond the
    rank's own step (a Ray actor call to a node of this type and its reply, measured by
    ``runtime/profiling.py``).

    Per-call fixed seconds of a stage's compute (``worker/call_terms.py``; None: not measured,
    the cost model then sums the layers' profiled times as they are): a rank runs a stage's
    layers, per microbatch, as one forward call and one backward call, and each call costs
    ``call_forward_s`` / ``call_backward_s`` beyond its layers' own work (the intercept of the
    call's time against the number of consecutive layers in it; emulated: stretched as the
    runtime stretches each call). The per-layer profile times every layer as its own call, so
    each layer's figure holds the intercept once: the cost model charges it once per stage and
    microbatch and nets it out of every layer.

    ``p2p_latency_s``: seconds of one point-to-point message between two gloo ranks on a node of
    this type, beyond its bytes over the link (``worker/p2p_latency.py``; None: not measured, as
    on GPU nodes, whose transfers are NCCL's); the cost model charges it per boundary transfer.

    ``gather_latency_s`` / ``gather_bytes_per_s`` and ``reduce_latency_s`` /
    ``reduce_bytes_per_s``: one gloo gather (``broadcast``) and one reduction of the
    layer-by-layer sharded path among ranks on a node of this type, each as ``latency + bytes /
    rate`` with its buffer work (``worker/collective_cost.py``; None: not measured, GPU nodes
    too); the cost model charges them per collective of that path, and the gather also for
    the once-a-step path's gather of updated slices.

    ``allreduce_latency_s`` / ``allreduce_bytes_per_s``: one gloo all-reduce of a flat gradient
    buffer among ranks on a node of this type, the same way (None: not measured); the cost model
    charges each gradient bucket at no less than it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework_bytes: int = Field(ge=0)
    state_bytes_per_param: float = Field(gt=0)
    optimizer: str = Field(min_length=1)
    source: str = ""
    microbatch_overhead_s: NonNegativeFloat | None = None
    step_overhead_s: NonNegativeFloat | None = None
    round_trip_s: NonNegativeFloat | None = None
    call_forward_s: NonNegativeFloat | None = None
    call_backward_s: NonNegativeFloat | None = None
    p2p_latency_s: NonNegativeFloat | None = None
    gather_latency_s: NonNegativeFloat | None = None
    gather_bytes_per_s: PositiveFloat | None = None
    reduce_latency_s: NonNegativeFloat | None = None
    reduce_bytes_per_s: PositiveFloat | None = None
    allreduce_latency_s: NonNegativeFloat | None = None
    allreduce_bytes_per_s: PositiveFloat | None = None


class ProfileFile(BaseModel):
    """A profile of one model on one device type."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = PROFILE_FORMAT
    model: str = Field(min_length=1)
    device_type: str = Field(min_length=1)
    sequence_length: PositiveInt | None = None
    dtype: str | None = None
    source: str = ""
    emulated: bool = False
    entries: list[ProfileEntry] = Field(min_length=1)
    # Our runtime's constants on this device, when the profiler measured them.
    runtime: RuntimeConstants | None = None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1) + "\n"


class ProfileSet:
    """Profiles for one model, looked up by (device type, microbatch size, tp)."""

    def __init__(self, files: list[ProfileFile] | tuple[ProfileFile, ...] = ()) -> None:
        self.files = tuple(sorted(files, key=lambda f: (f.model, f.device_type)))
        self._index: dict[tuple[str, int, int], ProfileEntry] = {}
        for f in self.files:
            for e in f.entries:
                self._index[(f.device_type, e.microbatch_size, e.tp)] = e

    def fitting(self, model: ModelSpec) -> ProfileSet:
        """The files measured for ``model``: its name, sequence length and dtype
        (:func:`mismatch` gives the reason a file is left out)."""
        return ProfileSet([f for f in self.files if mismatch(f, model) is None])

    def for_model(self, model_name: str) -> ProfileSet:
        """The subset measured for ``model_name``."""
        return ProfileSet([f for f in self.files if f.model == model_name])

    def lookup(self, device_type: str, microbatch_size: int, tp: int) -> ProfileEntry | None:
        return self._index.get((device_type, microbatch_size, tp))

    def device_types(self) -> list[str]:
        return sorted({f.device_type for f in self.files})

    def is_emulated(self, device_type: str) -> bool:
        return any(f.emulated for f in self.files if f.device_type == device_type)

    def runtime_constants(
        self, device_type: str, measured_on_device: bool = False, with_time_terms: bool = False
    ) -> RuntimeConstants | None:
        """Our runtime's measured constants on ``device_type`` (any profiled model's; the first
        file in order), or None. ``measured_on_device``: only from profiles of the device itself
        (an emulated profile ran on a CPU and says nothing of the device's own footprint).
        ``with_time_terms``: only constants that carry the per-microbatch and per-step terms."""
        for f in self.files:
            if f.device_type != device_type or f.runtime is None:
                continue
            if measured_on_device and f.emulated:
                continue
            if with_time_terms and f.runtime.microbatch_overhead_s is None:
                continue
            return f.runtime
        return None

    @classmethod
    def load(cls, paths: list[Path] | tuple[Path, ...]) -> ProfileSet:
        """Read every ``*.json`` profile under the given files or directories."""
        files: list[ProfileFile] = []
        sources: list[Path] = []
        for root in paths:
            if not root.exists():
                raise SpecError(
                    f"no such file or directory: {root}",
                    field="--profiles",
                    fix="pass a directory from `orchestrator profiles import` or the profiler",
                )
            candidates = sorted(root.rglob("*.json")) if root.is_dir() else [root]
            if not candidates:
                raise SpecError(
                    f"no profile files (*.json) in {root}",
                    field="--profiles",
                    fix="pass a directory from `orchestrator profiles import` or the profiler",
                )
            for path in candidates:
                files.append(read_profile(path))
                sources.append(path)
        _refuse_conflicts(files, sources)
        return cls(files)


def _refuse_conflicts(files: list[ProfileFile], sources: list[Path]) -> None:
    """Two files measuring the same (model, device type, microbatch, tp) cannot both be right."""
    seen: dict[tuple[str, str, int, int], Path] = {}
    for profile, path in zip(files, sources, strict=True):
        for entry in profile.entries:
            key = (profile.model, profile.device_type, entry.microbatch_size, entry.tp)
            if key in seen and seen[key] != path:
                raise SpecError(
                    f"two profiles of {profile.model} on {profile.device_type} (microbatch "
                    f"{entry.microbatch_size}, tp {entry.tp}): {seen[key]} and {path}",
                    field="--profiles",
                    fix="keep one of them",
                )
            seen[key] = path


def mismatch(profile: ProfileFile, model: ModelSpec) -> str | None:
    """Why ``profile`` does not describe ``model`` (another model, sequence length or dtype would
    mislead the cost model), or None when it does."""
    if profile.model != model.name:
        return f"it profiles model {profile.model!r}, not {model.name!r}"
    if profile.sequence_length is not None and profile.sequence_length != model.sequence_length:
        return (
            f"it was measured at sequence length {profile.sequence_length}, "
            f"the model has {model.sequence_length}"
        )
    if profile.dtype is not None and profile.dtype != model.dtype.value:
        return f"it was measured in {profile.dtype}, the model is {model.dtype.value}"
    return None


def read_profile(path: Path) -> ProfileFile:
    """Parse and validate one profile file, with a one-line error naming the field."""
    from orchestrator.spec.strict import check_booleans, check_finite, parse_text, read_text

    raw = parse_text(read_text(path, "profile"), str(path), json_only=True)
    check_finite(raw, str(path))
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    check_booleans(ProfileFile, raw, str(path))
    if raw.get("format", PROFILE_FORMAT) != PROFILE_FORMAT:
        raise SpecError(
            f"{path}: unknown format {raw.get('format')!r}; this version reads {PROFILE_FORMAT!r}",
            field="format",
            fix="re-import or re-measure the profile with this version",
        )
    try:
        profile = ProfileFile.model_validate(raw)
    except ValidationError as exc:
        from orchestrator.spec.loading import describe_validation_error

        raise SpecError(describe_validation_error(exc, str(path))) from None
    _refuse_negative_layers(profile, path)
    return profile


def _refuse_negative_layers(profile: ProfileFile, path: Path) -> None:
    """Planner layers count from 0 (the embedding); a negative index names no layer."""
    for n, entry in enumerate(profile.entries):
        negative = sorted(i for i in entry.layers if i < 0)
        if negative:
            raise SpecError(
                f"{path}: entries[{n}].layers: layer {negative[0]} is negative; planner layers "
                "count from 0 (the embedding)",
                field=f"entries[{n}].layers",
                fix="number the layers 0 (embedding), 1..num_layers (blocks), num_layers + 1 "
                "(head), or measure the profile again with `orchestrator profile`",
            )


def check_layer_range(profile: ProfileFile, path: Path, num_planner_layers: int) -> None:
    """Refuse a profile naming a layer the model does not have (a file for a deeper model of
    the same name, say): its figures would describe some other model."""
    for n, entry in enumerate(profile.entries):
        beyond = sorted(i for i in entry.layers if i >= num_planner_layers)
        if beyond:
            raise SpecError(
                f"{path}: entries[{n}].layers: layer {beyond[0]} is out of range; model "
                f"{profile.model!r} has planner layers 0..{num_planner_layers - 1} "
                f"({num_planner_layers - 2} blocks plus the embedding and the head)",
                field=f"entries[{n}].layers",
                fix="measure this model again with `orchestrator profile`, or pass the profiles "
                "measured for it",
            )
