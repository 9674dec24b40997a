#!/usr/bin/env bash
# Mixture of experts on the CPU: a Qwen3-MoE of 64 experts, top-8 (preset
# qwen3-moe-2.4b, 2.4 B parameters, 0.6 B active) against its dense twin of
# the same active size (qwen3-0.6b) in Ember, and against llama.cpp on the
# very same MoE GGUF files: prefill (512-token prompt) and decode (64
# tokens) tokens/s, random weights written by `ember mkmodel`, quantized by
# `ember quantize`.
#
# usage: bench/moe_vs_llamacpp.sh EMBER_BIN LLAMA_BENCH_BIN MODELS_DIR [ROUNDS] [REPEATS]
#   MODELS_DIR gets <preset>/ (bf16 safetensors) and <preset>-<type>.gguf once.
#   Each round runs ember MoE, ember dense and llama.cpp MoE (and llama.cpp
#   dense with LLAMA_DENSE=1), the order rotating from round to round; each
#   run is a warm-up plus REPEATS (default 2) timed repeats, whose mean is that
#   round's number. The machine is shared, so a cell is the median over ROUNDS
#   (default 3) rounds with [min-max]; ratios are of the medians. Before each
#   run the script waits while another benchmark (WAIT_FOR, a pgrep -f
#   pattern, default quant_vs_llamacpp) runs. Raw per-round numbers go to stderr.
# env: MOE (default qwen3-moe-2.4b), DENSE (default qwen3-0.6b), TYPES (default
#   "q8_0 q4_k_m"), THREADS (default 2), EMBER_ISA (default auto).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
EMBER=$1 LLB=$2 DIR=$3 ROUNDS=${4:-3} REPS=${5:-2}
MOE=${MOE:-qwen3-moe-2.4b} DENSE=${DENSE:-qwen3-0.6b} TYPES=${TYPES:-q8_0 q4_k_m} TH=${THREADS:-2}
WAIT_FOR=${WAIT_FOR:-quant_vs_llamacpp}
mkdir -p "$DIR"
for p in $MOE $DENSE; do
  for t in $TYPES; do
    [ -f "$DIR/$p-$t.gguf" ] && continue
    [ -f "$DIR/$p/model.safetensors" ] || "$EMBER" mkmodel --preset "$p" --dtype bf16 --out "$DIR/$p"
    "$EMBER" quantize --model "$DIR/$p" --type "$t" --out "$DIR/$p-$t.gguf"
  done
done

quiet() { while pgrep -f "$WAIT_FOR" > /dev/null; do sleep 10; done; }
# ember_run FILE -> "pp tg" (tokens/s)
ember_run() {
  quiet
  ember_pp_tg "$1" "$TH"
}
# llama_run FILE -> "pp tg"
llama_run() {
  quiet
  llama_pp_tg "$1" "$TH"
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $TH threads, ember --isa ${EMBER_ISA:-auto}, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| type | test | ember $MOE | ember $DENSE | MoE / dense | llama.cpp $MOE | ember / llama.cpp |$([ -n "${LLAMA_DENSE:-}" ] && echo " llama.cpp $DENSE |")"
echo "| --- | --- | --- | --- | --- | --- | --- |$([ -n "${LLAMA_DENSE:-}" ] && echo " --- |")"
for t in $TYPES; do
  fm="$DIR/$MOE-$t.gguf" fd="$DIR/$DENSE-$t.gguf"
  runs="em ed lm"; [ -n "${LLAMA_DENSE:-}" ] && runs="$runs ld"
  declare -A R=()
  for r in $(seq "$ROUNDS"); do
    set -- $runs; n=$#; k=$(( (r - 1) % n )); order="${*:k+1} ${*:1:k}" # rotate the order each round
    line=""
    for w in $order; do
      case $w in
        em) v=$(ember_run "$fm") ;; ed) v=$(ember_run "$fd") ;;
        lm) v=$(llama_run "$fm") ;; ld) v=$(llama_run "$fd") ;;
      esac
      R[$w]="${R[$w]:-} $v"; line="$line $w $v;"
    done
    echo "$t round $r:$line (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
  python3 - "$t" "${R[em]}" "${R[ed]}" "${R[lm]}" "${R[ld]:-}" <<'EOF'
import sys, statistics as st
t, em, ed, lm, ld = sys.argv[1:]
def split(s):
    v = [float(x) for x in s.split()]
    return v[0::2], v[1::2]
def cell(xs): return "%.1f [%.1f-%.1f]" % (st.median(xs), min(xs), max(xs))
E, D, L = split(em), split(ed), split(lm)
LD = split(ld) if ld.strip() else None
for i, test in enumerate(("pp512", "tg64")):
    row = "| %s | %s | %s | %s | **%.2f** | %s | **%.2f** |" % (t, test, cell(E[i]), cell(D[i]),
          st.median(E[i]) / st.median(D[i]), cell(L[i]), st.median(E[i]) / st.median(L[i]))
    if LD: row += " %s |" % cell(LD[i])
    print(row)
EOF
  unset R
done
