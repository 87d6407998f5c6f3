#!/usr/bin/env bash
# Installs everything the tests need into ./.venv, then runs the whole suite:
# lint (ruff), types (mypy --strict), layering (import-linter) and pytest.
# This is the README's test command; .ci/run calls exactly this. As root it installs Debian
# packages and builds Kubernetes 1.20 once (see the README); EDL_WITHOUT_KUBE=1 leaves out
# the tests that need it, and needs no root.
set -euo pipefail
cd "$(dirname "$0")/.."
# tests/simulations/test_native.py compiles the planner with mypyc: it needs a C compiler
# and Python's headers.
command -v cc >/dev/null || { apt-get update -q && apt-get install -y -q gcc; }
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || { apt-get update -q && apt-get install -y -q python3-dev; }
python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch first: an open range alone may pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[dev,sim,k8s,torch,paddle]'
ruff check .
ruff format --check .
lint-imports
mypy edl_scheduler trainer_runtime simulations
if [ -n "${EDL_WITHOUT_KUBE:-}" ]; then
  # No root needed: the tests that start a Kubernetes control plane are left out.
  pytest --ignore=tests/kube --deselect tests/cli/test_kube_backend.py
else
  bash scripts/kube-testenv.sh  # the Kubernetes 1.20 control plane of tests/kube, built once
  pytest
fi
