#!/usr/bin/env bash
# Prefill and decode of one GGUF file, Ember vs llama.cpp, at short and long
# context: pp512 + tg64, pp4096, and tg32 after 512 and after DEPTH tokens
# already in the context (is decode flat in the context length?). Written for
# the hybrid families (issue 12), whose recurrent layers keep a state of fixed
# size; it runs any GGUF both engines read.
#
# usage: bench/hybrid_vs_llamacpp.sh EMBER_BIN LLAMA_BENCH_BIN MODEL.gguf [DEPTH=8192] [THREADS=2]
# env:   KV: ember's --kv-type (default f16, llama.cpp's default cache type; llama.cpp runs
#        its default f16 cache), ROUNDS: rounds of the pp512 + tg64 pair (default 2),
#        LOCK: a file to flock around each run (e.g. /tmp/bench.lock, so that other
#        benchmarks on the machine wait), NICE: nice level of each run (default 0).
# Each run is one timed repetition after the warm-up that its engine does (ember
# bench's untimed pass or its -d tokens; llama-bench's warm-up, or its -d tokens
# with --no-warmup). llama-bench runs with --poll 0 (its threads sleep at barriers
# instead of spinning, which only matters when the cores are shared). Raw lines,
# each with the load average, go to stderr; a table to stdout, each cell the best
# of its runs with every run listed.
set -euo pipefail
EMBER=$1 LLB=$2 MODEL=$3 DEPTH=${4:-8192} TH=${5:-2}
KV=${KV:-f16} ROUNDS=${ROUNDS:-2} NICE=${NICE:-0}

run() { # wraps one timed run in the lock and the nice level
  if [ -n "${LOCK:-}" ]; then flock "$LOCK" nice -n "$NICE" "$@"; else nice -n "$NICE" "$@"; fi
}
ember() { # -p/-n/-d args -> "test tokens/s" lines
  run "$EMBER" bench --model "$MODEL" -t "$TH" -r 1 --kv-type "$KV" --json "$@" |
    python3 -c 'import sys,json
for l in sys.stdin:
    o=json.loads(l); t=o["test"].replace(" ", "")
    print(t[:-3] if t.endswith("@d1") else t, o["tokens_per_s"])'
}
llama() { # -p/-n/-d args -> "test tokens/s" lines
  run "$LLB" -m "$MODEL" -t "$TH" -r 1 --poll 0 -o jsonl "$@" 2>/dev/null | python3 -c 'import sys,json
for l in sys.stdin:
    o=json.loads(l)
    t=("pp%d" % o["n_prompt"]) if o["n_prompt"] > 0 else ("tg%d" % o["n_gen"])
    if o.get("n_depth", 0): t += "@d%d" % o["n_depth"]
    print(t, o["avg_ts"])'
}
log() { echo "### $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) :: $*" >&2; }

declare -A E L
add() { # engine test value
  if [ "$1" = ember ]; then E[$2]="${E[$2]:-} $3"; else L[$2]="${L[$2]:-} $3"; fi
}
one() { # engine label args...
  local eng=$1 label=$2; shift 2
  log "$eng $label"
  local out; out=$("$eng" "$@")
  echo "$out" >&2
  add "$eng" "$label" "$(echo "$out" | awk -v t="$label" '$1==t{print $2}')"
  if [ "$label" = pp512 ]; then add "$eng" tg64 "$(echo "$out" | awk '$1=="tg64"{print $2}')"; fi
}

echo "# $(basename "$MODEL"): $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $TH threads, ember --kv-type $KV, $(date -u '+%Y-%m-%d %H:%M UTC')"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then one ember pp512 -p 512 -n 64; one llama pp512 -p 512 -n 64
  else one llama pp512 -p 512 -n 64; one ember pp512 -p 512 -n 64; fi
done
one ember pp4096 -p 4096 -n 0 -d 1
one llama pp4096 -p 4096 -n 0 --no-warmup
for d in 512 "$DEPTH"; do
  one ember "tg32@d$d" -p 0 -n 32 -d "$d"
  one llama "tg32@d$d" -p 0 -n 32 -d "$d" --no-warmup
done

echo "| test | ember tok/s (runs) | llama.cpp tok/s (runs) | ember / llama.cpp |"
echo "| --- | --- | --- | --- |"
for t in pp512 tg64 pp4096 tg32@d512 "tg32@d$DEPTH"; do
  python3 - "$t" "${E[$t]:-}" "${L[$t]:-}" <<'EOF'
import sys
t, e, l = sys.argv[1:]
e = [float(x) for x in e.split()]; l = [float(x) for x in l.split()]
be, bl = max(e), max(l)
runs = lambda v: ", ".join(f"{x:.2f}" for x in v)
print(f"| {t} | **{be:.2f}** ({runs(e)}) | {bl:.2f} ({runs(l)}) | {be / bl:.2f} |")
EOF
done
