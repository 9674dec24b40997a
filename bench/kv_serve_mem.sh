#!/usr/bin/env bash
# The server's memory follows the KV positions in use, not --parallel x --ctx:
# `ember serve MODEL --parallel 64 --ctx 32768` (a reservation that would be
# 64 x 32768 positions), then C concurrent short requests (PROMPT_LEN prompt
# tokens, MAX_TOKENS generated) from build/bench/loadgen, sampling the
# server's resident memory (VmRSS) and /metrics while they run.
#
# usage: bench/kv_serve_mem.sh EMBER_BIN LOADGEN_BIN MODEL [KV_TYPE=f16] [C=64] [PROMPT_LEN=64] [MAX_TOKENS=64]
# Prints one markdown row: kind, requests, bytes per token, RSS idle, RSS
# peak, their difference, the KV bytes the requests hold at most (/metrics),
# positions in use at most (C x (PROMPT_LEN + MAX_TOKENS)) x bytes per token,
# what --parallel x --ctx would take (MiB), and errors / short answers.
set -euo pipefail
EMBER=$1 LOADGEN=$2 MODEL=$3 KV=${4:-f16} C=${5:-64} PL=${6:-64} MT=${7:-64}
PORT=${KV_MEM_PORT:-18491}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
"$EMBER" serve "$MODEL" --port "$PORT" --parallel 64 --ctx 32768 --kv-type "$KV" --threads 2 >/dev/null 2>&1 &
pid=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.2
done
rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$pid/status"; }
metric() { curl -sf "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
bpt=$(metric ember_kv_cache_bytes_per_token)
idle=$(rss)
vocab=$("$EMBER" info --model "$MODEL" 2>/dev/null | sed -n 's/^vocab *\([0-9][0-9]*\).*/\1/p')
"$LOADGEN" --port "$PORT" --concurrency "$C" --requests "$C" --prompt-len "$PL" --max-tokens "$MT" \
  --vocab "${vocab:-32000}" --json > /tmp/kv_serve_mem.$$ 2>/dev/null &
lg=$!
peak=$idle held=0
while kill -0 "$lg" 2>/dev/null; do
  r=$(rss); [ "$r" -gt "$peak" ] && peak=$r
  h=$(metric ember_kv_cache_used_bytes); h=${h%.*}; [ -n "$h" ] && [ "$h" -gt "$held" ] && held=$h
  sleep 0.1
done
wait "$lg" || true
errs=$(grep -o '"errors": *[0-9]*' /tmp/kv_serve_mem.$$ | grep -o '[0-9]*$' || echo "?")
short=$(grep -o '"short_requests": *[0-9]*' /tmp/kv_serve_mem.$$ | grep -o '[0-9]*$' || echo "?")
rm -f /tmp/kv_serve_mem.$$
awk -v kv="$KV" -v c="$C" -v pl="$PL" -v mt="$MT" -v bpt="$bpt" -v idle="$idle" -v peak="$peak" -v held="$held" \
    -v errs="$errs" -v short="$short" 'BEGIN {
  mib = 1048576; inuse = c * (pl + mt) * bpt; resv = 64 * 32768 * bpt;
  printf("| %s | %d x (%d + %d) | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %s / %s |\n", kv, c, pl, mt, bpt,
         idle / mib, peak / mib, (peak - idle) / mib, held / mib, inuse / mib, resv / mib, errs, short) }'
