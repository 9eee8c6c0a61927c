#!/usr/bin/env bash
# Regenerate both lock files from pyproject.toml at the newest versions its ranges allow:
#   bash requirements/refresh.sh
# dev.lock is what the tests (and so CI) install; runtime.lock is what the container images install.
# pyproject.toml keeps ranges for library users. Run the test suite on the new lock before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
"$tools/venv/bin/pip" install --quiet pip-tools==7.6.2
export CUSTOM_COMPILE_COMMAND="bash requirements/refresh.sh"
common=(--quiet --upgrade --strip-extras --no-emit-index-url --no-emit-find-links)
"$tools/venv/bin/pip-compile" "${common[@]}" --extra dev --output-file requirements/dev.lock pyproject.toml
"$tools/venv/bin/pip-compile" "${common[@]}" --output-file requirements/runtime.lock pyproject.toml
echo "refreshed requirements/dev.lock and requirements/runtime.lock"
