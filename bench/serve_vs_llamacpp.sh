#!/usr/bin/env bash
# Serving throughput, `ember serve` vs llama-server on the very same GGUF file:
# C concurrent streaming /v1/completions clients (build/bench/loadgen), random
# token-id prompts of PROMPT_LEN, MAX_TOKENS generated per request with
# ignore_eos, greedy (WORKLOADS may add a sampled one). Reports aggregate
# output tokens/s, TTFT and ITL per concurrency level, and the ratio
# ember / llama-server.
#
# usage: bench/serve_vs_llamacpp.sh EMBER_BIN LLAMA_SERVER_BIN LOADGEN_BIN MODEL.gguf
#          [CONCURRENCIES="1 4 16 64"] [THREADS=2]
#   Two workloads: "mixed" (64-token prompts, 64 output tokens, max(4, 2C)
#   requests) and "decode" (8-token prompts, 128 output tokens, max(4, C)
#   requests, so nearly all work is decoding); WORKLOADS (default "mixed
#   decode") may add "sampled": the mixed one sampled at temperature
#   TEMP (0.8) and top_p TOP_P (0.95), top_k and min_p off, seeded per
#   request, with other prompts than mixed's (loadgen --seed 1: a prefix
#   cache holds nothing of them from the mixed run). For each concurrency C each
#   server is started fresh with C parallel slots (ember -P C; llama-server
#   -np C with continuous batching), a 256-token context per slot and THREADS
#   compute threads, warmed up with one request, measured on each workload
#   and stopped; the servers never run together. PROMPT_VOCAB (default: the
#   model's vocabulary) bounds the random prompt ids; EMBER_ISA (default auto)
#   is ember's --isa (with EMBER_CPU_NO_VNNI=1 in the environment: the plain
#   AVX2 kernels, an AVX2-only machine's). Raw loadgen lines go to stderr.
# llama-server is built separately, outside this repository (see RESULTS.md).
set -euo pipefail
EMBER=$1 LLS=$2 LOADGEN=$3 MODEL=$4
CONCS=${5:-1 4 16 64} THREADS=${6:-2}
PORT=${SERVE_BENCH_PORT:-18473}
WORKLOADS=${WORKLOADS:-mixed decode}
VOCAB=${PROMPT_VOCAB:-$("$EMBER" info --model "$MODEL" 2>/dev/null | sed -n 's/^vocab *\([0-9][0-9]*\).*/\1/p')}
VOCAB=${VOCAB:-32000}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true' EXIT

# healthy: whether /health answers 200 (curl, or python3 where there is no curl)
healthy() {
  if command -v curl >/dev/null; then
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
      "http://127.0.0.1:$PORT/health" >/dev/null 2>&1
  fi
}

wait_health() {
  for _ in $(seq 600); do
    healthy && return 0
    kill -0 "$pid" 2>/dev/null || { echo "server exited during start-up" >&2; return 1; }
    sleep 0.5
  done
  echo "server did not become healthy" >&2
  return 1
}

# run NAME C: measures the running server ($pid) on each workload at
# concurrency C, appends "NAME WORKLOAD C tok/s ttft50 ttft99 itl50 itl99
# errors short" to $TMPF, then stops the server.
TMPF=$(mktemp)
run() {
  local name=$1 c=$2 w plen ntok n j
  wait_health
  "$LOADGEN" --port "$PORT" --concurrency 1 --requests 1 --prompt-len 8 --max-tokens 8 --vocab "$VOCAB" >/dev/null
  for w in $WORKLOADS; do
    samp=()
    case $w in
      mixed) plen=64 ntok=64 n=$((2 * c)) ;;
      sampled) plen=64 ntok=64 n=$((2 * c)) samp=(--temperature "${TEMP:-0.8}" --top-p "${TOP_P:-0.95}" --seed 1) ;;
      decode) plen=8 ntok=128 n=$c ;;
      *) echo "unknown workload $w" >&2; return 1 ;;
    esac
    [ "$n" -lt 4 ] && n=4
    j=$("$LOADGEN" --port "$PORT" --concurrency "$c" --requests "$n" --prompt-len "$plen" --max-tokens "$ntok" \
      --vocab "$VOCAB" "${samp[@]}" --json) || true
    echo "$name $w $j (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    python3 -c 'import sys,json
o=json.loads(sys.argv[3]); print(sys.argv[1], sys.argv[2], o["concurrency"], o["output_tokens_per_s"], o["ttft_p50_ms"],
  o["ttft_p99_ms"], o["itl_p50_ms"], o["itl_p99_ms"], o["errors"], o["short_requests"])' "$name" "$w" "$j" >>"$TMPF"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# model $(basename "$MODEL"), $THREADS threads, ember --isa ${EMBER_ISA:-auto}${EMBER_CPU_NO_VNNI:+ with EMBER_CPU_NO_VNNI}, prompt ids below $VOCAB"
for c in $CONCS; do
  "$EMBER" serve "$MODEL" --port "$PORT" -P "$c" -c 256 -t "$THREADS" --isa "${EMBER_ISA:-auto}" >/dev/null 2>&1 &
  pid=$!
  run ember "$c"
  "$LLS" -m "$MODEL" --port "$PORT" -np "$c" -c $((c * 256)) -t "$THREADS" -tb "$THREADS" -cb >/dev/null 2>&1 &
  pid=$!
  run llama "$c"
done
python3 - "$TMPF" <<'EOF'
import os, sys
rows = {}
for l in open(sys.argv[1]):
    n, w, c, tps, t50, t99, i50, i99, err, short = l.split()
    rows.setdefault(w, {}).setdefault(int(c), {})[n] = (float(tps), float(t50), float(t99), float(i50), float(i99),
                                                       int(err), int(short))
for w, title in (("mixed", "64-token prompts, 64 output tokens"),
                 ("sampled", "as mixed, sampled: temperature %s, top_p %s" % (os.environ.get("TEMP", "0.8"),
                                                                             os.environ.get("TOP_P", "0.95"))),
                 ("decode", "8-token prompts, 128 output tokens")):
    if w not in rows: continue
    print()
    print("%s (%s):" % (w, title))
    print()
    print("| streams | ember tok/s | llama-server tok/s | ratio | TTFT p50 / p99 ms (ember; llama) | ITL p50 / p99 ms (ember; llama) |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = None
    for c in sorted(rows[w]):
        e, l = rows[w][c].get("ember"), rows[w][c].get("llama")
        if not e or not l: continue
        if base is None: base = e[0]
        note = ""
        if e[5] or l[5] or e[6] or l[6]:
            note = " errors %d / %d, short answers %d / %d" % (e[5], l[5], e[6], l[6])
        print("| %d | %.1f (%.1fx) | %.1f | **%.2f** | %.0f / %.0f; %.0f / %.0f | %.1f / %.1f; %.1f / %.1f |%s" % (
            c, e[0], e[0] / base, l[0], e[0] / l[0], e[1], e[2], l[1], l[2], e[3], e[4], l[3], l[4], note))
EOF
rm -f "$TMPF"
