#!/usr/bin/env bash
# Quantized CPU speed, Ember vs llama.cpp on the very same GGUF files:
# prefill (512-token prompt) and decode (64 tokens) tokens/s at 1 and 2
# threads, for random-weight models of Qwen2.5-0.5B's and Llama-3.2-1B's
# shapes in Q8_0, Q4_0 and Q4_K_M written by `ember quantize`.
#
# usage: bench/quant_vs_llamacpp.sh EMBER_BIN LLAMA_BENCH_BIN MODELS_DIR [ROUNDS] [REPEATS] [FILTER]
#   MODELS_DIR gets <preset>/ (bf16 safetensors) and <preset>-<type>.gguf once.
#   Each (model, type, threads) runs Ember and llama.cpp back to back, ROUNDS
#   times (default 3), alternating which side goes first; each run is a
#   warm-up plus REPEATS (default 2) timed repeats, whose mean is that
#   round's number. The machine is shared, so a table cell is the median
#   over rounds, with [min-max] across rounds; the ratio is of the medians.
#   FILTER (a grep -E pattern on "model type threads", e.g. 'q4_0 2$') keeps
#   only the matching rows. Raw per-round numbers go to stderr.
# env: PRESETS (default "qwen2.5-0.5b llama3.2-1b"; any `ember mkmodel --list`
#   preset, e.g. gemma3-1b), TYPES (default "q8_0 q4_0 q4_k_m"; any `ember quantize`
#   GGUF type, e.g. bf16), THREADS (default
#   "1 2"), EMBER_ISA (ember's --isa, default auto; the header line names it; with
#   EMBER_CPU_NO_VNNI=1 ember runs as on a CPU without VNNI / AMX, e.g. against a
#   llama.cpp built for AVX2 alone).
# llama.cpp is built separately, outside this repository (see RESULTS.md).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
EMBER=$1 LLB=$2 DIR=$3 ROUNDS=${4:-3} REPS=${5:-2} FILTER=${6:-.}
mkdir -p "$DIR"
PRESETS=${PRESETS:-qwen2.5-0.5b llama3.2-1b} TYPES=${TYPES:-q8_0 q4_0 q4_k_m}
for p in $PRESETS; do
  [ -f "$DIR/$p/model.safetensors" ] || "$EMBER" mkmodel --preset "$p" --dtype bf16 --out "$DIR/$p"
  for t in $TYPES; do
    [ -f "$DIR/$p-$t.gguf" ] || "$EMBER" quantize --model "$DIR/$p" --type "$t" --out "$DIR/$p-$t.gguf"
  done
done

# ember_run FILE THREADS -> "pp tg" (tokens/s)
ember_run() { ember_pp_tg "$1" "$2"; }
# llama_run FILE THREADS -> "pp tg"
llama_run() { llama_pp_tg "$1" "$2"; }

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, ember --isa ${EMBER_ISA:-auto}${EMBER_CPU_NO_VNNI:+ with EMBER_CPU_NO_VNNI (no VNNI, no AMX)}, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model | type | threads | ember pp512 | llama.cpp pp512 | ratio | ember tg64 | llama.cpp tg64 | ratio |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for p in $PRESETS; do
  for t in $TYPES; do
    f="$DIR/$p-$t.gguf"
    for th in ${THREADS:-1 2}; do
      echo "$p $t $th" | grep -qE "$FILTER" || continue
      E="" L=""
      for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then e=$(ember_run "$f" "$th"); l=$(llama_run "$f" "$th")
        else l=$(llama_run "$f" "$th"); e=$(ember_run "$f" "$th"); fi
        echo "$p $t t$th round $r: ember $e | llama.cpp $l (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        E="$E $e" L="$L $l"
      done
      python3 - "$p" "$t" "$th" "$E" "$L" <<'EOF'
import sys, statistics as st
p, t, th, E, L = sys.argv[1:]
E = [float(v) for v in E.split()]; L = [float(v) for v in L.split()]
def cell(xs): return "%.1f [%.1f-%.1f]" % (st.median(xs), min(xs), max(xs))
ep, eg, lp, lg = E[0::2], E[1::2], L[0::2], L[1::2]
print("| %s | %s | %s | %s | %s | **%.2f** | %s | %s | **%.2f** |" % (p, t, th, cell(ep), cell(lp),
      st.median(ep) / st.median(lp), cell(eg), cell(lg), st.median(eg) / st.median(lg)))
EOF
    done
  done
done
