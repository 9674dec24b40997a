#!/usr/bin/env bash
# Time to first token per turn of an 8-turn chat over a long system prompt,
# with ember's prompt cache and without it (cache_prompt: false), on one
# `ember serve` (bench/prefix_chat.py drives the chat).
#
# usage: bench/prefix_chat.sh EMBER_BIN MODEL [TURNS=8] [SYSTEM_WORDS=1500] [THREADS=2]
# Prints a markdown table: turn, prompt tokens, cached tokens, TTFT with the
# cache, TTFT without, and the new tokens' share of the prompt.
set -euo pipefail
EMBER=$1 MODEL=$2 TURNS=${3:-8} WORDS=${4:-1500} TH=${5:-2}
PORT=${PREFIX_CHAT_PORT:-18556}
DIR=$(cd "$(dirname "$0")" && pwd)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
"$EMBER" serve "$MODEL" --port "$PORT" --parallel 4 --ctx 8192 --threads "$TH" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.2
done
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), $TH threads"
python3 "$DIR/prefix_chat.py" "$PORT" "$TURNS" "$WORDS" cache > /tmp/prefix_chat_c.$$
python3 "$DIR/prefix_chat.py" "$PORT" "$TURNS" "$WORDS" nocache > /tmp/prefix_chat_n.$$
python3 - /tmp/prefix_chat_c.$$ /tmp/prefix_chat_n.$$ <<'PY'
import json, sys
c = [json.loads(l) for l in open(sys.argv[1]) if '"turn"' in l]
n = [json.loads(l) for l in open(sys.argv[2]) if '"turn"' in l]
print("| turn | prompt tokens | cached | TTFT cached (s) | TTFT uncached (s) | cached / uncached |")
print("| --- | --- | --- | --- | --- | --- |")
for a, b in zip(c, n):
    print(f"| {a['turn']} | {a['prompt_tokens']} | {a['cached_tokens']} | {a['ttft_s']:.3f} | {b['ttft_s']:.3f} | {a['ttft_s'] / b['ttft_s']:.3f} |")
PY
rm -f /tmp/prefix_chat_c.$$ /tmp/prefix_chat_n.$$
