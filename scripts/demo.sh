#!/usr/bin/env bash
# Installs EDL into ./.venv and runs the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q -e .
edl-plan-demo "$@"
