#!/usr/bin/env bash
# Time to first token per turn of an 8-turn chat over a long system prompt
# (bench/prefix_chat.py drives the chat), in one run:
#   ember serve with its prompt cache, and without it (cache_prompt: false);
#   ember serve with --prompt-cache-dir, restarted before every turn (the
#   first request after a restart, answered from the disk tier);
#   llama-server on the same GGUF with cache_prompt (its default) and without,
#   when LLAMA_SERVER names its binary.
#
# usage: [LLAMA_SERVER=path/to/llama-server] bench/prefix_chat.sh EMBER_BIN MODEL.gguf [TURNS=8] [SYSTEM_WORDS=1500] [THREADS=2]
# Prints a markdown table: turn, prompt tokens, the tokens the cached turn prefilled,
# then TTFT per setup; the new tokens' prefill time (`ember bench -p NEW -d CACHED`, the
# same KV kind and threads: a forward of just those positions at that depth) and the
# cached TTFT over it; the TTFT after a restart over the uncached (cold) one.
set -euo pipefail
EMBER=$1 MODEL=$2 TURNS=${3:-8} WORDS=${4:-1500} TH=${5:-2}
PORT=${PREFIX_CHAT_PORT:-18556}
DIR=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
pid=""
stop() { [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; pid=""; }
trap 'stop; rm -rf "$TMP"' EXIT
wait_up() {
  for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not come up" >&2
  exit 1
}
start_ember() { # extra args...
  "$EMBER" serve "$MODEL" --port "$PORT" --parallel 4 --ctx 8192 --threads "$TH" "$@" >>"$TMP/ember.log" 2>&1 &
  pid=$!
  wait_up
}
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), $TH threads"
start_ember
python3 "$DIR/prefix_chat.py" "$PORT" "$TURNS" "$WORDS" cache >"$TMP/c"
python3 "$DIR/prefix_chat.py" "$PORT" "$TURNS" "$WORDS" nocache >"$TMP/n"
stop
# the disk tier: a restart before every turn (-v: the tier logs its writes and restores)
: >"$TMP/ember.log"
start_ember --prompt-cache-dir "$TMP/pcache" -v
cat >"$TMP/restart.sh" <<EOF
kill -INT \$(cat "$TMP/pid") && while kill -0 \$(cat "$TMP/pid") 2>/dev/null; do sleep 0.05; done
"$EMBER" serve "$MODEL" --port "$PORT" --parallel 4 --ctx 8192 --threads "$TH" --prompt-cache-dir "$TMP/pcache" -v >>"$TMP/ember.log" 2>&1 &
echo \$! > "$TMP/pid"
for _ in \$(seq 1200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && exit 0; sleep 0.1; done
exit 1
EOF
echo "$pid" >"$TMP/pid"
pid=""
RESTART_CMD="bash $TMP/restart.sh" python3 "$DIR/prefix_chat.py" "$PORT" "$TURNS" "$WORDS" restart >"$TMP/r"
kill -INT "$(cat "$TMP/pid")" 2>/dev/null || true
while kill -0 "$(cat "$TMP/pid")" 2>/dev/null; do sleep 0.05; done
echo "# disk tier, per turn:"
grep -E "prompt cache: (wrote|restored)" "$TMP/ember.log" | sed 's/^ember: debug: /#   /' || true
if [ -n "${LLAMA_SERVER:-}" ]; then
  "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" -np 4 -c 32768 -t "$TH" --jinja >"$TMP/llama.log" 2>&1 &
  pid=$!
  wait_up
  python3 "$DIR/prefix_chat.py" "$PORT" "$TURNS" "$WORDS" cache >"$TMP/lc"
  python3 "$DIR/prefix_chat.py" "$PORT" "$TURNS" "$WORDS" nocache >"$TMP/ln"
  stop
fi
# the prefill time of each cached turn's new tokens at its depth
python3 - "$TMP/c" <<'PY' | while read -r new depth; do
import json, sys
for l in open(sys.argv[1]):
    if '"turn"' in l:
        r = json.loads(l)
        print(r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"])
PY
  "$EMBER" bench --model "$MODEL" -p "$new" -n 0 -t "$TH" -d "$depth" -r 3 --kv-type f16 --json 2>/dev/null |
    python3 -c "import json,sys; print(json.dumps({'new': $new, 'depth': $depth, 'tps': json.loads(sys.stdin.readline())['tokens_per_s']}))" >>"$TMP/pp"
done
python3 - "$TMP" <<'PY'
import json, os, sys
d = sys.argv[1]
def rows(n):
    p = os.path.join(d, n)
    return [json.loads(l) for l in open(p) if '"turn"' in l] if os.path.exists(p) else []
c, n, r, lc, ln = rows("c"), rows("n"), rows("r"), rows("lc"), rows("ln")
pp = [json.loads(l) for l in open(os.path.join(d, "pp"))] if os.path.exists(os.path.join(d, "pp")) else []
hdr = "| turn | prompt tokens | new tokens | ember cached (s) | ember uncached (s) | ember after restart (s) |"
sep = "| --- | --- | --- | --- | --- | --- |"
if lc:
    hdr += " llama-server cached (s) | llama-server uncached (s) |"
    sep += " --- | --- |"
hdr += " new-token prefill (s) | ember cached / new-token prefill | after restart / cold prefill |"
sep += " --- | --- | --- |"
print(hdr)
print(sep)
for i, a in enumerate(c):
    b, x = n[i], r[i]
    new = a["prompt_tokens"] - a["cached_tokens"]  # the positions this turn prefilled
    est = new / pp[i]["tps"] if i < len(pp) and pp[i].get("tps") else float("nan")
    line = f"| {a['turn']} | {a['prompt_tokens']} | {new} | {a['ttft_s']:.3f} | {b['ttft_s']:.3f} | {x['ttft_s']:.3f} ({x['cached_tokens']} cached) |"
    if lc:
        line += f" {lc[i]['ttft_s']:.3f} ({lc[i]['cached_tokens']} cached) | {ln[i]['ttft_s']:.3f} |"
    line += f" {est:.3f} | {a['ttft_s'] / est:.2f} | {x['ttft_s'] / b['ttft_s']:.3f} |"
    print(line)
PY
