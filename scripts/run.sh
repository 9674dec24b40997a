#!/usr/bin/env bash
# Builds ember and runs its main job: generating tokens with a model.
# With no arguments it writes a small demo model with random weights
# (models/tiny, made by `ember mkmodel`) and generates from it, so it works
# on a fresh machine with no downloads. Its output is meaningless token ids:
# the weights are random.
#
# usage: scripts/run.sh                       demo model
#        scripts/run.sh --model DIR --ids 1,2,3 -n 32 --temp 0   a real model
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ember
if [ $# -eq 0 ]; then
  [ -f models/tiny/model.safetensors ] || ./build/ember mkmodel --preset tiny --out models/tiny
  set -- --model models/tiny --ids 1,2,3,4,5 -n 24 --temp 0
fi
exec ./build/ember generate "$@"
