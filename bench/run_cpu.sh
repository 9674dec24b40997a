#!/usr/bin/env bash
# CPU benchmark of the foundation (prefill and decode at 1 and 2 threads) on
# a model of Qwen2.5-0.5B's shape with random weights, in bf16 and f32, and
# decode speed as a fraction of the memory-bandwidth limit.
#
# usage: bench/run_cpu.sh [build-dir]    (models are written to models/ once)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$B" -j"$(nproc)" --target ember membw >/dev/null
for dt in bf16 f32; do
  d=models/qwen2.5-0.5b-$dt
  [ -f "$d/model.safetensors" ] || "$B/ember" mkmodel --preset qwen2.5-0.5b --dtype "$dt" --out "$d"
done
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $(date -u +%Y-%m-%d)"
bw=$("$B/bench/membw" 1 2)
echo "$bw"
for dt in bf16 f32; do
  "$B/ember" bench --model models/qwen2.5-0.5b-$dt -p 512 -n 64 -t 1,2 -r 3 --json
done | while read -r line; do
  echo "$line"
  case "$line" in *'"test": "tg'*)
    t=$(echo "$line" | sed 's/.*"threads": \([0-9]*\).*/\1/')
    tps=$(echo "$line" | sed 's/.*"tokens_per_s": \([0-9.]*\).*/\1/')
    wb=$(echo "$line" | sed 's/.*"weight_bytes": \([0-9]*\).*/\1/')
    gbs=$(echo "$bw" | sed -n "s/.*\"threads\": $t, \"read_GBps\": \([0-9.]*\).*/\1/p")
    awk -v tps="$tps" -v wb="$wb" -v gbs="$gbs" -v t="$t" 'BEGIN {
      lim = gbs * 1e9 / wb;
      printf("  decode at %d threads: %.2f tok/s x %.3f GB/token = %.2f GB/s = %.0f%% of the %.2f GB/s measured (limit %.2f tok/s)\n",
             t, tps, wb / 1e9, tps * wb / 1e9, 100 * tps / lim, gbs, lim) }'
  esac
done
