#!/usr/bin/env bash
# The wheels a GPU host without a package index needs besides what its image has (torch, triton, numpy):
# the service packages the inference code imports (pydantic and friends, SQLAlchemy, FastAPI,
# OpenTelemetry, ...) at this repository's locked versions (requirements/dev.lock), and fla for
# the KDA kernels' reference paths. Downloaded here (the device reaches no index) for CPython
# 3.12 on manylinux into .whl/ (git-ignored), ~19 MB; carry `.whl` in the call and start it with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
# `--stack`: also what the REST API and runner processes import there when the whole stack runs with
# no services (`python -m benchmarks.agent_traces --services local`: SQLite, tools in-process). Found
# by running that stack in a venv holding only the image's packages and these wheels: the image has
# httpx, prometheus-client, click, h11 and pillow; the runner adds isal (preprocess's PNG inflate).
# No psycopg, Celery, Redis, Kafka or OpenCV on that path.
# Run from the repository root: bash benchmarks/device_wheels.sh [--stack]
set -euo pipefail
LOCK=requirements/dev.lock
# what the device image lacks (found by importing `inference` there); versions from the lock
PKGS=(alembic annotated-types fastapi jsonschema jsonschema-specifications mako
  opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions pydantic pydantic-core
  pydantic-settings python-dotenv referencing rpds-py sqlalchemy starlette typing-inspection
  uvicorn llguidance tiktoken regex jinja2 markupsafe tokenizers)
STACK=(isal)
[ "${1:-}" = "--stack" ] && PKGS+=("${STACK[@]}")
# not in the lock: fla for the KDA reference paths; truststore, which the image's huggingface_hub
# (under transformers, the reference side of benchmarks/long_context.py) imports
EXTRA=(fla-core==0.6.0 flash-linear-attention==0.6.0 truststore==0.10.5)
pins=()
for p in "${PKGS[@]}"; do
  pin=$(grep -i -E "^${p//-/[-_]}==" "$LOCK" | head -1 || true)
  [ -n "$pin" ] || { echo "no pin for $p in $LOCK" >&2; exit 1; }
  pins+=("$pin")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}" "${EXTRA[@]}"
ls .whl | wc -l
du -sh .whl
