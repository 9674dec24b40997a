#!/usr/bin/env bash
# Decode speed deep in the context, Ember vs llama.cpp on the same GGUF file
# and KV precision: tokens/s of generating N tokens after DEPTH tokens
# already in the context (llama-bench -d), for f16, 8-bit and 4-bit KV
# (ember --kv-type f16|q8|q4; llama.cpp -fa 1 -ctk/-ctv f16|q8_0|q4_0, its
# quantized cache needing its flash attention), at THREADS threads.
#
# usage: bench/kv_vs_llamacpp.sh EMBER_BIN LLAMA_BENCH_BIN MODEL.gguf DEPTH [ROUNDS=3] [THREADS=2] [N=32]
# Every run prefills DEPTH untimed tokens, then times N decode steps once
# (no warm-up run: the prefill warms everything). A round runs the six
# (engine, kind) pairs, alternating which engine goes first; a cell is the
# median over rounds with [min-max]. The machine is shared: only the
# medians of rounds taken close together compare. Raw lines go to stderr.
# env: KINDS, the (ember:llama.cpp) pairs to run, default "f16:f16 q8:q8_0 q4:q4_0".
set -euo pipefail
EMBER=$1 LLB=$2 MODEL=$3 D=$4 ROUNDS=${5:-3} TH=${6:-2} N=${7:-32}
KINDS=${KINDS:-f16:f16 q8:q8_0 q4:q4_0} # ember:llama.cpp pairs; f16 first (the ratio column needs it)

ember_tg() { # KIND -> tokens/s
  "$EMBER" bench --model "$MODEL" -p 0 -n "$N" -d "$D" -t "$TH" -r 1 --kv-type "$1" --json |
    sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' | tail -1
}
llama_tg() { # TYPE -> tokens/s
  "$LLB" -m "$MODEL" -p 0 -n "$N" -d "$D" -t "$TH" -r 1 --no-warmup -fa 1 -ctk "$1" -ctv "$1" -o jsonl 2>/dev/null |
    sed -n 's/.*"avg_ts": \([0-9.]*\).*/\1/p' | tail -1
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), depth $D, $ROUNDS rounds"
declare -A E L
for r in $(seq "$ROUNDS"); do
  for pair in $KINDS; do
    ek=${pair%%:*} lk=${pair##*:}
    if [ $((r % 2)) = 1 ]; then e=$(ember_tg "$ek"); l=$(llama_tg "$lk"); else l=$(llama_tg "$lk"); e=$(ember_tg "$ek"); fi
    echo "round $r $ek: ember $e | llama.cpp $l (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    E[$ek]="${E[$ek]:-} $e" L[$ek]="${L[$ek]:-} $l"
  done
done
echo "| depth | KV (ember / llama.cpp) | ember tg$N | llama.cpp tg$N | ember / llama.cpp | ember vs its f16 |"
echo "| --- | --- | --- | --- | --- | --- |"
for pair in $KINDS; do
  ek=${pair%%:*} lk=${pair##*:}
  python3 - "$D" "$ek" "$lk" "${E[$ek]}" "${L[$ek]}" "${E[f16]}" <<'EOF'
import sys, statistics as st
d, ek, lk, e, l, b = sys.argv[1:]
e = [float(x) for x in e.split()]; l = [float(x) for x in l.split()]; b = [float(x) for x in b.split()]
me, ml, mb = st.median(e), st.median(l), st.median(b)
rng = lambda v: f"[{min(v):.2f}-{max(v):.2f}]" if len(v) > 1 else ""
print(f"| {d} | {ek} / {lk} | {me:.2f} {rng(e)} | {ml:.2f} {rng(l)} | {me / ml:.2f}x | {me / mb:.2f} |")
EOF
done
