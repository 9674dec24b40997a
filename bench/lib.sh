# bench/lib.sh - shell functions shared by the ember-vs-llama.cpp scripts
# (quant_vs_llamacpp.sh, moe_vs_llamacpp.sh); sourced, never run.
# They read $EMBER (the ember binary), $LLB (llama-bench), $REPS (repetitions
# per run) and EMBER_ISA (default auto).

# ember_pp_tg MODEL THREADS: one `ember bench` pp512 + tg64 run; prints "PP TG" (tokens/s)
ember_pp_tg() {
  "$EMBER" bench --model "$1" -p 512 -n 64 -t "$2" -r "$REPS" --isa "${EMBER_ISA:-auto}" --json | python3 -c 'import sys,json
r={}
for l in sys.stdin:
    o=json.loads(l); r[o["test"]]=o["tokens_per_s"]
print(r["pp512"], r["tg64"])'
}

# llama_pp_tg MODEL THREADS: the same with llama-bench; prints "PP TG" (tokens/s)
llama_pp_tg() {
  "$LLB" -m "$1" -p 512 -n 64 -t "$2" -r "$REPS" -o jsonl 2>/dev/null | python3 -c 'import sys,json
r={}
for l in sys.stdin:
    o=json.loads(l); r["pp" if o["n_prompt"] > 0 else "tg"]=o["avg_ts"]
print(r["pp"], r["tg"])'
}
