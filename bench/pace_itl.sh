#!/usr/bin/env bash
# Step pacing, ember alone: the inter-token latency of 16 decoding streams
# with and without prompts arriving beside them. Starts `ember serve MODEL
# -P 16 -c 256 -t 2 EXTRA...` (EXTRA: e.g. --prefill-pace 3, or
# --prefill-pace off), warms it with one request, then runs two loads with
# build/bench/loadgen at 16 streams:
#   mixed:  32 requests of 64-token prompts, 64 tokens out each
#   decode: 16 requests of 8-token prompts, 128 tokens out each
# and prints one line per load: output tokens/s, TTFT p50/p99 and ITL
# p50/p99 (ms). The A/B runs of bench/RESULTS.md "Step pacing: the default"
# ran this (then a file in /tmp) once per configuration.
#
# usage: bench/pace_itl.sh EMBER_BIN LOADGEN_BIN MODEL [EXTRA_SERVE_ARGS...]
# env:   PACE_PORT (default 18555), PACE_VOCAB (token ids drawn below it;
#        default: the model's vocabulary from `ember info`)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 EMBER_BIN LOADGEN_BIN MODEL [EXTRA_SERVE_ARGS...]" >&2; exit 2; }
EMBER=$1 LOADGEN=$2 MODEL=$3
shift 3
PORT=${PACE_PORT:-18555}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
"$EMBER" serve "$MODEL" --port "$PORT" -P 16 -c 256 -t 2 "$@" >/dev/null 2>&1 &
pid=$!
up=0
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && { up=1; break; }
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
[ "$up" = 1 ] || { echo "$0: the server did not come up on port $PORT" >&2; exit 1; }
vocab=${PACE_VOCAB:-$("$EMBER" info --model "$MODEL" 2>/dev/null | sed -n 's/^vocab *\([0-9][0-9]*\).*/\1/p')}
vocab=${vocab:-32000}
"$LOADGEN" --port "$PORT" --concurrency 1 --requests 1 --prompt-len 8 --max-tokens 8 --vocab "$vocab" >/dev/null
for load in mixed decode; do
  if [ "$load" = mixed ]; then args="--requests 32 --prompt-len 64 --max-tokens 64"
  else args="--requests 16 --prompt-len 8 --max-tokens 128"; fi
  # shellcheck disable=SC2086
  j=$("$LOADGEN" --port "$PORT" --concurrency 16 $args --vocab "$vocab" --json)
  python3 -c 'import sys, json
o = json.loads(sys.argv[2])
print("%-6s tok/s %.1f  TTFT p50/p99 %.0f/%.0f ms  ITL p50/p99 %.1f/%.1f ms  errors %s" % (sys.argv[1],
      o["output_tokens_per_s"], o["ttft_p50_ms"], o["ttft_p99_ms"], o["itl_p50_ms"], o["itl_p99_ms"], o.get("errors", "?")))' \
    "$load" "$j"
done
