#!/usr/bin/env bash
# bench/spec_vs_llamacpp.sh - speculative decoding, Ember vs llama.cpp on the
# same GGUF files, at THREADS threads, f16 KV in both.
#
# usage: bench/spec_vs_llamacpp.sh window MODEL.gguf
#        bench/spec_vs_llamacpp.sh e2e TARGET.gguf DRAFT.gguf IDS
#
# window: the ceiling on speedup. The time of one forward of T = 1..WINDOW
#   tokens of one sequence after DEPTH tokens of context (a verify window of
#   T - 1 drafts), relative to T = 1 (one decode step). Ember:
#   `spec_bench --window` (ember_bench_run_at, DEPTH prefilled untimed before
#   every timed run, one warm-up run per T, then REPS rounds over
#   T = 1..WINDOW, the median per T); llama.cpp: REPS runs of `llama-bench
#   -p 1,2,..,WINDOW -n 0 -d DEPTH -r 1` (the same shape: DEPTH untimed, then
#   a T-token batch, after its own warm-up run; the median per T). Both ask
#   the logits of the window's last position only, so the output head's cost
#   for the other T - 1 positions (which a real verify window pays) is in
#   neither.
# e2e: one request (prompt = the comma-separated token ids IDS, fed as they
#   are, no BOS added; GEN greedy tokens, EOS ignored) plainly, with n-gram
#   drafts and with DRAFT as a draft model, DRAFT_MAX drafts per step.
#   Ember: `spec_bench --ids IDS --streams 1` (the serving engine, plain and
#   speculative alternating in one process, the best of REPS runs each, time
#   from submit to the last token; the n-gram and the draft-model rows are
#   two such runs, each with its own plain figure, the speedup against it).
#   llama.cpp: `llama-server -np 1` started once per configuration (plain;
#   --spec-type ngram-simple; --spec-type draft-simple -md DRAFT), REPS POST
#   /completion requests with cache_prompt false, the best by prompt_ms +
#   predicted_ms (the same span). Acceptance =
#   accepted / drafted; tokens per target forward = decode tokens / target
#   forwards, for llama.cpp derived as (n - 1) / (n - 1 - accepted) (every
#   forward after the prompt's yields one token plus its accepted drafts).
#   N-gram: Ember matches exactly NGRAM tokens (--ngram-min = --ngram-max),
#   llama.cpp's ngram-simple a lookup of NGRAM tokens and a draft of up to
#   DRAFT_MAX; the two copy rules differ (Ember continues a copy that runs
#   into the end of the history, ngram-simple stops there), so drafted
#   counts may differ (on stories260K they agree). Draft model: both draft
#   greedily DRAFT_MAX tokens every step (llama.cpp --spec-draft-p-min 0
#   --spec-draft-n-min 0).
#   "same" columns: Ember plain = Ember speculative (spec_bench checks), and
#   each llama.cpp run's tokens = Ember's plain tokens.
#
# env: EMBER_BUILD (build), LLAMA_BIN (/tmp/llama.cpp/build/bin), THREADS (2),
#   DEPTH (256), WINDOW (16), REPS (3), GEN (128), DRAFT_MAX (8), NGRAM (3),
#   ISA (ember's kernels, auto), PORT (18093), LOCK (a file: every
#   measurement runs under `flock LOCK`), NICE (its nice level, with LOCK;
#   default -10). Tables go to stdout, raw lines to stderr.
set -euo pipefail
MODE=${1:?usage: spec_vs_llamacpp.sh window MODEL | e2e TARGET DRAFT IDS}
EB=${EMBER_BUILD:-build} LB=${LLAMA_BIN:-/tmp/llama.cpp/build/bin}
TH=${THREADS:-2} DEPTH=${DEPTH:-256} WINDOW=${WINDOW:-16} REPS=${REPS:-3} GEN=${GEN:-128}
DMAX=${DRAFT_MAX:-8} NG=${NGRAM:-3} PORT=${PORT:-18093} ISA=${ISA:-auto}
SB=$EB/bench/spec_bench

locked() { # CMD...: runs CMD under the benchmark lock when LOCK is set
  if [ -n "${LOCK:-}" ]; then flock "$LOCK" nice -n "${NICE:--10}" "$@"; else "$@"; fi
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $TH threads, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), ember $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo ?)"

if [ "$MODE" = window ]; then
  MODEL=${2:?model}
  e_out=$(locked "$SB" --model "$MODEL" --window "$WINDOW" --depth "$DEPTH" --reps "$REPS" --threads "$TH" --kv-type f16 --isa "$ISA")
  echo "$e_out" >&2
  echo "ember: $(echo "$e_out" | head -1)"
  l_out=
  for _ in $(seq "$REPS"); do # rounds of one run per T, as spec_bench --window does
    l_out+=$(locked "$LB/llama-bench" -m "$MODEL" -p "$(seq -s, 1 "$WINDOW")" -n 0 -d "$DEPTH" -r 1 -t "$TH" -o jsonl 2>/dev/null)$'\n'
  done
  echo "$l_out" >&2
  python3 - "$e_out" "$l_out" "$DEPTH" <<'EOF'
import sys, json, statistics as st
e_out, l_out, depth = sys.argv[1:]
e = {}
for line in e_out.splitlines():
    f = line.split()
    if len(f) == 4 and f[0].isdigit():
        e[int(f[0])] = float(f[1])
l = {}
for line in l_out.splitlines():
    if line.startswith("{"):
        o = json.loads(line)
        l.setdefault(o["n_prompt"], []).extend(o["samples_ns"])
l = {t: st.median(v) / 1e6 for t, v in l.items()}
print(f"| tokens in the forward (depth {depth}) | ember ms | ember x decode | llama.cpp ms | llama.cpp x decode |")
print("| --- | --- | --- | --- | --- |")
for t in sorted(set(e) | set(l)):
    ee = f"{e[t]:.2f} | {e[t] / e[1]:.2f}" if t in e and 1 in e else "- | -"
    ll = f"{l[t]:.2f} | {l[t] / l[1]:.2f}" if t in l and 1 in l else "- | -"
    print(f"| {t} | {ee} | {ll} |")
EOF
  exit 0
fi

[ "$MODE" = e2e ] || { echo "spec_vs_llamacpp.sh: unknown mode '$MODE'" >&2; exit 1; }
TGT=${2:?target} DRAFT=${3:?draft} IDS=${4:?ids}
NIDS=$(echo "$IDS" | tr ',' '\n' | grep -c .)
CTX=$(( (NIDS + GEN + DMAX + 64 + 255) / 256 * 256 ))

ember_row() { # NAME [spec_bench options]: prints "NAME|plain tok/s|spec tok/s|drafted|accepted|tok/fwd|same|tokens"
  local name=$1; shift
  local out
  out=$(locked "$SB" --model "$TGT" --ids "$IDS" --streams 1 --gen "$GEN" --draft-max "$DMAX" --reps "$REPS" \
    --threads "$TH" --kv-type f16 --isa "$ISA" "$@") || { echo "$name|error: spec_bench failed"; return; }
  echo "$out" >&2
  echo "$out" | python3 -c '
import sys
name = sys.argv[1]; row = toks = None
for line in sys.stdin:
    f = line.split()
    if f and f[0] == "tokens": toks = f[1]
    elif len(f) == 10 and f[0].isdigit(): row = f
# streams plain spec speedup drafted accepted pct tok/fwd(spec/plain) steps same
print("|".join([name, row[1], row[2], row[4], row[5], row[7].split("/")[0], row[9], toks or ""]))' "$name"
}

llama_row() { # NAME [llama-server options]: prints "NAME|tok/s|drafted|accepted|tok/fwd|tokens" or "NAME|error: ..."
  local name=$1; shift
  local log=/tmp/spec_vs_llamacpp.$$.log
  ${LOCK:+nice -n ${NICE:--10}} "$LB/llama-server" -m "$TGT" -np 1 -c "$CTX" -t "$TH" -tb "$TH" --port "$PORT" --host 127.0.0.1 "$@" >"$log" 2>&1 &
  local pid=$!
  local ok=0
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then ok=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if [ $ok = 0 ]; then
    echo "$name|error: llama-server did not start: $(grep -iE 'error|fail|abort' "$log" | head -3 | tr '\n|' '  ')"
    kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    return
  fi
  locked python3 - "$name" "$PORT" "$IDS" "$GEN" "$REPS" <<'EOF' || echo "$name|error: request failed"
import sys, json, urllib.request
name, port, ids, gen, reps = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",") if x], int(sys.argv[4]), int(sys.argv[5])
best = None
for _ in range(reps):
    body = json.dumps({"prompt": ids, "n_predict": gen, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": False, "return_tokens": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    o = json.load(urllib.request.urlopen(req, timeout=600))
    t = o["timings"]
    secs = (t["prompt_ms"] + t["predicted_ms"]) / 1e3
    print(name, json.dumps(t), file=sys.stderr)
    if best is None or secs < best[0]:
        best = (secs, t, o.get("tokens", []))
secs, t, toks = best
n = t["predicted_n"]
dr, ac = t.get("draft_n", 0), t.get("draft_n_accepted", 0)
print("|".join([name, f"{n / secs:.1f}", str(dr), str(ac), f"{(n - 1) / (n - 1 - ac):.2f}" if n > 1 + ac else "-",
                ",".join(str(x) for x in toks)]))
EOF
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  grep -E "draft acceptance|statistics" "$log" >&2 || true
  rm -f "$log"
}

E_NG=$(ember_row ngram --ngram-min "$NG" --ngram-max "$NG")
E_DR=$(ember_row draft --draft-model "$DRAFT")
L_PL=$(llama_row plain)
L_NG=$(llama_row ngram --spec-type ngram-simple --spec-ngram-simple-size-n "$NG" --spec-ngram-simple-size-m "$DMAX" \
  --spec-draft-n-max "$DMAX")
L_DR=$(llama_row draft --spec-type draft-simple -md "$DRAFT" --spec-draft-n-max "$DMAX" --spec-draft-n-min 0 \
  --spec-draft-p-min 0 -td "$TH" -tbd "$TH")
python3 - "$E_NG" "$E_DR" "$L_PL" "$L_NG" "$L_DR" "$GEN" "$DMAX" "$NG" <<'EOF'
import sys
e_ng, e_dr, l_pl, l_ng, l_dr = (a.split("|") for a in sys.argv[1:6])
gen, dmax, ng = sys.argv[6:9]
ref = e_ng[7] if len(e_ng) > 7 else ""
def pct(d, a): return f"{int(a)} of {int(d)} ({100 * int(a) / int(d):.1f}%)" if int(d) else "0 of 0"
print(f"| engine | source | tokens/s | speedup | accepted of drafted | tokens / target forward | same tokens |")
print("| --- | --- | --- | --- | --- | --- | --- |")
# each spec_bench run times its own plain runs: the speedup is against those
plains = " / ".join(f"{float(r[1]):.1f}" for r in (e_ng, e_dr) if len(r) > 7)
print(f"| ember | plain (in each run) | {plains} | 1.00x | - | 1.00 | - |")
for r in (e_ng, e_dr):
    if len(r) < 8: print(f"| ember | {r[0]} | {'|'.join(r[1:])} | | | | |"); continue
    src = f"n-gram {ng}" if r[0] == "ngram" else "draft model"
    print(f"| ember | {src} | {float(r[2]):.1f} | {float(r[2]) / float(r[1]):.2f}x | {pct(r[3], r[4])} | {r[5]} | {r[6]} (spec = plain) |")
base = float(l_pl[1]) if len(l_pl) > 5 else None
for r in (l_pl, l_ng, l_dr):
    if len(r) < 6: print(f"| llama.cpp | {r[0]} | {r[1]} | | | | |"); continue
    src = {"plain": "plain", "ngram": f"ngram-simple {ng}/{dmax}", "draft": "draft-simple"}[r[0]]
    sp = f"{float(r[1]) / base:.2f}x" if base else "-"
    acc = "-" if r[0] == "plain" else pct(r[2], r[3])
    same = "yes" if r[5] == ref else ("NO" if ref else "?")
    print(f"| llama.cpp | {src} | {r[1]} | {sp} | {acc} | {r[4] if r[0] != 'plain' else '1.00'} | {same} (= ember plain) |")
EOF
