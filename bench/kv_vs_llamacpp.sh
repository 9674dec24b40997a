#!/usr/bin/env bash
# Decode speed deep in the context, Ember vs llama.cpp on the same GGUF file
# and KV precision: tokens/s of generating N tokens after DEPTH tokens
# already in the context (llama-bench -d), for f16, 8-bit and 4-bit KV
# (ember --kv-type f16|q8|q4; llama.cpp -fa 1 -ctk/-ctv f16|q8_0|q4_0, the
# quantized cache needing its flash attention), at THREADS threads.
#
# usage: bench/kv_vs_llamacpp.sh EMBER_BIN LLAMA_BENCH_BIN MODEL.gguf [DEPTHS="4096 16384"] [THREADS=2] [REPEATS=2] [N=32]
# Each row runs Ember then llama.cpp; each run prefills DEPTH untimed tokens
# before every timed repeat. Raw outputs go to stderr.
set -euo pipefail
EMBER=$1 LLB=$2 MODEL=$3 DEPTHS=${4:-4096 16384} TH=${5:-2} REPS=${6:-2} N=${7:-32}

ember_tg() { # KIND DEPTH -> tokens/s
  "$EMBER" bench --model "$MODEL" -p 0 -n "$N" -d "$2" -t "$TH" -r "$REPS" --kv-type "$1" --json |
    tee /dev/stderr | sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' | tail -1
}
llama_tg() { # TYPE DEPTH -> tokens/s
  "$LLB" -m "$MODEL" -p 0 -n "$N" -d "$2" -t "$TH" -r "$REPS" -fa 1 -ctk "$1" -ctv "$1" -o jsonl 2>/dev/null |
    tee /dev/stderr | sed -n 's/.*"avg_ts": \([0-9.]*\).*/\1/p' | tail -1
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| depth | KV | ember tg$N | llama.cpp tg$N | ember / llama.cpp | ember vs its f16 |"
echo "| --- | --- | --- | --- | --- | --- |"
for d in $DEPTHS; do
  base=""
  for pair in f16:f16 q8:q8_0 q4:q4_0; do
    ek=${pair%%:*} lk=${pair##*:}
    e=$(ember_tg "$ek" "$d")
    l=$(llama_tg "$lk" "$d")
    [ -z "$base" ] && base=$e
    awk -v d="$d" -v ek="$ek" -v lk="$lk" -v e="$e" -v l="$l" -v b="$base" 'BEGIN {
      printf("| %d | %s / %s | %.2f | %.2f | %.2fx | %.2f |\n", d, ek, lk, e, l, e / l, e / b) }'
  done
done
