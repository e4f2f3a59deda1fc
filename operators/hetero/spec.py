"""The HeteroTrainingJob spec, validated once at the edge into frozen value objects.

Field names are camelCase, as Kubernetes users write them; the CRD's openAPIV3Schema
(``helm/orchestrator/crds/heterotrainingjobs.yaml``) checks the shape at admission, and this
module checks what a schema cannot (min <= max, unique pool names, known device types). A bad spec
raises :class:`~orchestrator.errors.SpecError` naming the field and the fix.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from operators.hetero.devices import gpu_product_for, known_device_types
from orchestrator.errors import SpecError
from orchestrator.spec.job import JobSpec as RunJobSpec

DEFAULT_METRICS_PORT = 9400
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class PoolSpec(BaseModel):
    """One GPU pool: a KubeRay worker group pinned to one GPU product."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=40)
    deviceType: str = Field(min_length=1)
    gpuProduct: str | None = None
    gpusPerPod: int = Field(default=1, ge=1)
    minReplicas: int = Field(default=0, ge=0)
    maxReplicas: int = Field(ge=1)
    replicas: int | None = Field(default=None, ge=0)
    cpu: str = "4"
    memory: str = "16Gi"
    nodeSelector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        if self.minReplicas > self.maxReplicas:
            raise ValueError(
                f"minReplicas ({self.minReplicas}) > maxReplicas ({self.maxReplicas}); "
                "lower minReplicas or raise maxReplicas"
            )
        if self.replicas is not None and not self.minReplicas <= self.replicas <= self.maxReplicas:
            raise ValueError(
                f"replicas ({self.replicas}) outside [minReplicas, maxReplicas] = "
                f"[{self.minReplicas}, {self.maxReplicas}]"
            )
        if self.gpuProduct is None and gpu_product_for(self.deviceType) is None:
            raise ValueError(
                f"deviceType {self.deviceType!r} has no known nvidia.com/gpu.product; use one of "
                f"{', '.join(known_device_types())} or set gpuProduct"
            )
        return self

    @property
    def gpu_product(self) -> str:
        """The ``nvidia.com/gpu.product`` value this pool's pods select."""
        product = self.gpuProduct or gpu_product_for(self.deviceType)
        assert product is not None  # checked in _check
        return product

    @property
    def initial_replicas(self) -> int:
        return self.minReplicas if self.replicas is None else self.replicas


class HeadSpec(BaseModel):
    """The Ray head pod (runs the controller; no GPU)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: str = "2"
    memory: str = "8Gi"


class PodSettings(BaseModel):
    """Settings for every Ray pod (the chart's ``pod`` values, storage and service account)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    env: list[dict[str, Any]] = []
    envFrom: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    volumeMounts: list[dict[str, Any]] = []
    serviceAccountName: str | None = None
    imagePullSecrets: list[dict[str, str]] = []
    affinity: dict[str, Any] = {}
    tolerations: list[dict[str, Any]] = []
    priorityClassName: str | None = None
    tmpSize: str = "20Gi"

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> PodSettings:
        names = {v.get("name") for v in self.volumes}
        missing = sorted({str(m.get("name")) for m in self.volumeMounts} - names)
        if missing:
            raise ValueError(f"volumeMounts name {', '.join(missing)}, which no volume defines; "
                             "add the volume to pod.volumes")
        return self


class JobSpec(BaseModel):
    """The spec of a HeteroTrainingJob."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(min_length=1)
    imagePullPolicy: str = "IfNotPresent"
    rayVersion: str = "2.60.0"
    head: HeadSpec = HeadSpec()
    pools: list[PoolSpec] = Field(min_length=1)
    # The `orchestrator run` job spec, passed through (orchestrator.spec.job checks it at run time).
    job: dict[str, Any] = {}
    # Where the run's controller listens; default http://<cluster>-head-svc.<ns>.svc:<metrics port>.
    controllerURL: str | None = None
    suspend: bool = False
    # Secret (key ``token``) the node-events endpoint checks; mounted into the head pod.
    nodeEventsTokenSecret: str | None = None
    pod: PodSettings = PodSettings()

    @model_validator(mode="after")
    def _checkpoints_on_shared_storage(self) -> JobSpec:
        checkpoint = self.job.get("checkpoint")
        directory = checkpoint.get("dir") if isinstance(checkpoint, dict) else None
        if not isinstance(directory, str):
            return self
        mounts = [str(m.get("mountPath", "")).rstrip("/") for m in self.pod.volumeMounts]
        if not any(m and (directory == m or directory.startswith(m + "/")) for m in mounts):
            raise ValueError(
                f"job.checkpoint.dir {directory!r} is on no shared volume, so a replaced pod "
                "could not read the checkpoints; mount a ReadWriteMany claim there with "
                "pod.volumes and pod.volumeMounts"
            )
        return self

    @model_validator(mode="after")
    def _unique_pools(self) -> JobSpec:
        names = [p.name for p in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique; {', '.join(duplicates)} repeated")
        return self

    @property
    def metrics_port(self) -> int:
        """The controller's metrics port: ``job.metrics.port``, else 9400."""
        metrics = self.job.get("metrics")
        port = metrics.get("port") if isinstance(metrics, dict) else None
        return int(port) if isinstance(port, int) and port > 0 else DEFAULT_METRICS_PORT

    def job_document(self) -> dict[str, Any]:
        """The job mapping for /etc/orchestrator/job.yaml, listening on all interfaces in the pod.

        Only ``metrics.host``/``metrics.port`` are filled in where absent (the default host is
        loopback, which Prometheus could not scrape); everything else passes through unchanged.
        """
        document = dict(self.job)
        metrics = dict(document.get("metrics") or {})
        metrics.setdefault("host", "0.0.0.0")
        metrics.setdefault("port", self.metrics_port)
        document["metrics"] = metrics
        return document


def parse_job_spec(spec: dict[str, Any]) -> JobSpec:
    """Validate a custom resource's ``spec``; raise SpecError naming the first bad field.

    ``spec.job`` is checked with the package's own job model too, so a typo there fails here (and
    shows in the job's status) instead of when ``orchestrator run`` starts in the RayJob.
    """
    try:
        parsed = JobSpec.model_validate(spec)
    except ValidationError as exc:
        raise _spec_error(exc, "spec") from None
    if parsed.job:
        try:
            RunJobSpec.model_validate(parsed.job_document())
        except ValidationError as exc:
            raise _spec_error(exc, "spec.job") from None
    return parsed


def _spec_error(exc: ValidationError, prefix: str) -> SpecError:
    error = exc.errors()[0]
    field = prefix + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
    )
    message = error["msg"].removeprefix("Value error, ")
    return SpecError(message, field=field, fix=_fix_for(error["type"]))


def _fix_for(error_type: str) -> str | None:
    fixes = {
        "missing": "add the field",
        "extra_forbidden": "remove the field or check its spelling",
        "string_pattern_mismatch": "use lowercase letters, digits and '-'",
    }
    return fixes.get(error_type)
