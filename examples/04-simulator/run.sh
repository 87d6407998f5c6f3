#!/usr/bin/env bash
# Elastic EDL beside the rigid baselines on one day of the Philly trace.
set -euo pipefail
cd "$(dirname "$0")/../.."
TRACES="${EDL_TRACES:-../shared/traces}"
python -m simulations run \
  --trace "$TRACES/philly-derived/philly_1d.csv" --format tiresias \
  --cluster "$TRACES/tiresias/n32g4.csv" \
  --elasticity elastic --scaling amdahl:0.1 \
  --policy edl --policy edl@rigid --policy tiresias --policy fifo-gang \
  --processes 4 --out out/04-simulator
