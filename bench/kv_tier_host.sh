#!/usr/bin/env bash
# kv_tier_host.sh - decode speed deep in the context by kernel tier and KV kind, on a
# many-core host that has neither our Debian build dependencies nor a quiet neighbour
# to spare: the GPU machine's Xeon, reached through the device tool. Builds ember (CPU
# only), writes one model (`ember mkmodel` preset, then `ember quantize`), then runs every
# (ISA, KV kind) cell COPIES times, all at once where the cores allow: each run pinned to
# its own THREADS physical cores (one hyperthread of each), so that the cells of a wave
# share one machine state and compare with each other even when the host is not idle.
#
# usage: bench/kv_tier_host.sh OUT_DIR
# env:   EMBER_DEBS=DIR   .deb files of our build dependencies (scripts/debs-prefix.sh)
#        DEPTH (16384), N (32 decode steps timed), THREADS (2), COPIES (2),
#        ISAS ("amx avx512"), KINDS ("f16 q8"), PRESET (qwen2.5-0.5b), TYPE (q8_0), JOBS,
#        EMBER_BIN (an ember already built: no build)
# Writes OUT_DIR/host.txt (lscpu), runs.txt (one line per run: wave, cores, isa, kind,
# tokens/s) and table.md (median per cell [min-max], and the q8-like / f16 ratio per ISA).
# Keeps build-host/ and models/host/ (git ignores them) for the next call.
set -uo pipefail
OUT=${1:?usage: bench/kv_tier_host.sh OUT_DIR}
mkdir -p "$OUT"
JOBS=${JOBS:-$(nproc)}
DEPTH=${DEPTH:-16384} N=${N:-32} TH=${THREADS:-2} COPIES=${COPIES:-2}
PRESET=${PRESET:-qwen2.5-0.5b} TYPE=${TYPE:-q8_0}
. "$(dirname "$0")/../scripts/debs-prefix.sh"
debs_prefix_env || exit 1
{ lscpu; echo; lscpu -e; echo; uptime; } >"$OUT/host.txt" 2>&1
E=${EMBER_BIN:-}
if [ -z "$E" ]; then
t0=$SECONDS
cmake -S . -B build-host -DCMAKE_BUILD_TYPE=Release "${CMAKE_EXTRA[@]}" >"$OUT/build-ember.log" 2>&1 &&
  cmake --build build-host -j"$JOBS" --target ember >>"$OUT/build-ember.log" 2>&1 ||
  { echo "ember build failed (build-ember.log)"; exit 1; }
echo "ember built in $((SECONDS - t0)) s"
E=build-host/ember
fi
mkdir -p models/host
M=models/host/$PRESET-$TYPE.gguf
[ -f "models/host/$PRESET/model.safetensors" ] ||
  "${RUN_ENV[@]}" "$E" mkmodel --preset "$PRESET" --dtype bf16 --out "models/host/$PRESET" >"$OUT/model.log" 2>&1 ||
  { echo "mkmodel failed (model.log)"; exit 1; }
[ -f "$M" ] || "${RUN_ENV[@]}" "$E" quantize --model "models/host/$PRESET" --type "$TYPE" --out "$M" >>"$OUT/model.log" 2>&1 ||
  { echo "quantize failed (model.log)"; exit 1; }

# one CPU per physical core (the lowest-numbered hyperthread), then groups of TH of them
mapfile -t CPUS < <(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' | sort -t, -k3,3n -k2,2n -k1,1n |
  awk -F, '!seen[$3","$2]++ { print $1 }')
SLOTS=$(( ${#CPUS[@]} / TH ))
[ "$SLOTS" -ge 1 ] || { echo "fewer than $TH physical cores"; exit 1; }
slot_cpus() { local s=$1 i list=; for ((i = 0; i < TH; i++)); do list+=${list:+,}${CPUS[s * TH + i]}; done; echo "$list"; }

CELLS=()
for c in $(seq "$COPIES"); do for isa in ${ISAS:-amx avx512}; do for k in ${KINDS:-f16 q8}; do
  CELLS+=("$isa $k"); done; done; done
echo "${#CELLS[@]} runs, $SLOTS at a time (${#CPUS[@]} physical cores, $TH threads each), depth $DEPTH"
: >"$OUT/runs.txt"
wave=0
for ((i = 0; i < ${#CELLS[@]}; i += SLOTS)); do
  wave=$((wave + 1))
  echo "wave $wave $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/runs.txt"
  pids=()
  for ((s = 0; s < SLOTS && i + s < ${#CELLS[@]}; s++)); do
    read -r isa k <<<"${CELLS[i + s]}"
    cpus=$(slot_cpus "$s")
    ( tps=$("${RUN_ENV[@]}" taskset -c "$cpus" "$E" bench --model "$M" -p 0 -n "$N" -d "$DEPTH" -t "$TH" -r 1 \
          --kv-type "$k" --isa "$isa" --json 2>>"$OUT/bench-stderr.log" |
          sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' | tail -1)
      echo "$wave $cpus $isa $k ${tps:-failed}" >>"$OUT/runs.txt" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
done
echo "done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/runs.txt"

# table: median [min-max] per (isa, kind); ratio of each kind to f16 on the same ISA
awk -v kinds="${KINDS:-f16 q8}" '
  NF == 5 && $5 != "failed" { v[$3" "$4] = v[$3" "$4] " " $5; isas[$3] = 1 }
  function med(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
      if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    lo = a[1]; hi = a[n]; return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { nk = split(kinds, K, " "); printf "| isa |"; for (k = 1; k <= nk; k++) printf " %s tok/s |", K[k]
    for (k = 2; k <= nk; k++) printf " %s / %s |", K[k], K[1]; print ""
    printf "| --- |"; for (k = 1; k < 2 * nk; k++) printf " --- |"; print ""
    for (isa in isas) { printf "| %s |", isa
      for (k = 1; k <= nk; k++) { m[k] = med(v[isa" "K[k]]); printf " %.2f [%s-%s] |", m[k], lo, hi }
      for (k = 2; k <= nk; k++) printf " **%.3f** |", (m[1] > 0 ? m[k] / m[1] : 0); print "" } }
' "$OUT/runs.txt" >"$OUT/table.md"
cat "$OUT/table.md"
