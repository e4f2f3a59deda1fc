# syntax=docker/dockerfile:1
# The orchestrator image: Ray, torch and this project, for the Ray head and workers (`orchestrator
# run`, `ray start`) and the operator (`python -m operators.hetero`). Runs as the non-root user
# `ray` (uid 1000, gid 100), as the chart's security context expects.
#
#   docker build --build-arg VARIANT=cpu  -t REGISTRY/orchestrator:0.1.0-cpu .
#   docker build --build-arg VARIANT=cuda -t REGISTRY/orchestrator:0.1.0 .
#
# The base is pinned to an exact Python and Debian release; pin it by digest too with
#   --build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest>
# (docs/kubernetes.md, "Build the image"). The CUDA variant needs no CUDA base: PyTorch's CUDA
# wheels carry their CUDA libraries, and the node's NVIDIA container toolkit mounts the driver.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG VARIANT=cpu
ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0

# bash runs KubeRay's `ray start` command; KubeRay's liveness and readiness probes call wget.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --gid 100 --create-home --shell /bin/bash ray

WORKDIR /opt/orchestrator
COPY --chown=1000:100 . .
USER 1000:100
RUN VARIANT="${VARIANT}" RAY_VERSION="${RAY_VERSION}" TORCH_VERSION="${TORCH_VERSION}" \
        bash scripts/image_install.sh \
    && .venv/bin/python -m compileall -q orchestrator operators

# Pods run with a read-only root filesystem: HOME and Ray's files go under /tmp (an emptyDir).
ENV PATH=/opt/orchestrator/.venv/bin:${PATH} \
    HOME=/tmp/home \
    PYTHONDONTWRITEBYTECODE=1
CMD ["orchestrator", "--help"]
