#!/usr/bin/env bash
# Quantized CPU speed, Ember vs llama.cpp on the very same GGUF files:
# prefill (512-token prompt) and decode (64 tokens) tokens/s at 1 and 2
# threads, for random-weight models of Qwen2.5-0.5B's and Llama-3.2-1B's
# shapes in Q8_0, Q4_0 and Q4_K_M written by `ember quantize`.
#
# usage: bench/quant_vs_llamacpp.sh EMBER_BIN LLAMA_BENCH_BIN MODELS_DIR [ROUNDS] [REPEATS]
#   MODELS_DIR gets <preset>/ (bf16 safetensors) and <preset>-<type>.gguf once.
#   Each (model, type, threads) runs Ember and llama.cpp back to back, ROUNDS
#   times (default 2); the best round of each side is kept (the machine is
#   shared, so the best is the least disturbed). Prints one markdown row per
#   (model, type, threads) with both speeds and the ratio ember / llama.cpp.
# llama.cpp is built separately, outside this repository (see RESULTS.md).
set -euo pipefail
EMBER=$1 LLB=$2 DIR=$3 ROUNDS=${4:-2} REPS=${5:-2}
mkdir -p "$DIR"
for p in qwen2.5-0.5b llama3.2-1b; do
  [ -f "$DIR/$p/model.safetensors" ] || "$EMBER" mkmodel --preset "$p" --dtype bf16 --out "$DIR/$p"
  for t in q8_0 q4_0 q4_k_m; do
    [ -f "$DIR/$p-$t.gguf" ] || "$EMBER" quantize --model "$DIR/$p" --type "$t" --out "$DIR/$p-$t.gguf"
  done
done
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model | type | threads | ember pp512 | llama.cpp pp512 | ratio | ember tg64 | llama.cpp tg64 | ratio |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for p in qwen2.5-0.5b llama3.2-1b; do
  for t in q8_0 q4_0 q4_k_m; do
    f="$DIR/$p-$t.gguf"
    for th in 1 2; do
      ep=0 eg=0 lp=0 lg=0
      for r in $(seq "$ROUNDS"); do
        out=$("$EMBER" bench --model "$f" -p 512 -n 64 -t "$th" -r "$REPS" --json)
        v=$(echo "$out" | sed -n 's/.*"test": "pp512".*"tokens_per_s": \([0-9.]*\).*/\1/p')
        ep=$(python3 -c "print(max($ep, $v))")
        v=$(echo "$out" | sed -n 's/.*"test": "tg64".*"tokens_per_s": \([0-9.]*\).*/\1/p')
        eg=$(python3 -c "print(max($eg, $v))")
        out=$("$LLB" -m "$f" -p 512 -n 64 -t "$th" -r "$REPS" -o jsonl 2>/dev/null)
        v=$(echo "$out" | python3 -c 'import sys,json
for l in sys.stdin:
    o=json.loads(l)
    if o["n_prompt"]>0: print(o["avg_ts"])')
        lp=$(python3 -c "print(max($lp, $v))")
        v=$(echo "$out" | python3 -c 'import sys,json
for l in sys.stdin:
    o=json.loads(l)
    if o["n_gen"]>0: print(o["avg_ts"])')
        lg=$(python3 -c "print(max($lg, $v))")
      done
      python3 -c "print('| $p | $t | $th | %.1f | %.1f | **%.2f** | %.2f | %.2f | **%.2f** |' % ($ep, $lp, $ep/$lp, $eg, $lg, $eg/$lg))"
    done
  done
done
