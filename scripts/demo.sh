#!/usr/bin/env bash
# Installs EDL into ./.venv and runs its demo on the local backend (`edlctl demo`): a 4-slot
# cluster where a high-priority job shrinks a low-priority elastic PyTorch job, which grows
# back once the high-priority job is done. Ends with a JSON line of what it measured.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch: the CPU build, pinned, unless one is installed already (an open range alone may
# pull a multi-GB CUDA build on a CPU machine).
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[torch]'
edlctl demo "$@"
