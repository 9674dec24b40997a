#!/usr/bin/env bash
# host_cpu_bench.sh - bench/quant_vs_llamacpp.sh on a machine that has none of our Debian
# build dependencies: the GPU machine's host CPU (a many-core Xeon with AVX-512 and AMX),
# reached through the device tool. Builds ember (CPU only); writes the models once; then runs
# the side by side against a llama-bench built there beforehand (by a script of your own,
# outside this repository: see bench/RESULTS.md for the flags ours used, GGML_NATIVE=ON), once
# per ember ISA. With SERVE set, serving instead: bench/serve_vs_llamacpp.sh against
# llama-server on the Qwen2.5-0.5B shape in Q8_0 with a real tokenizer.
#
# usage: bench/host_cpu_bench.sh OUT_DIR
# env:   EMBER_DEBS=DIR      .deb files of our build dependencies (scripts/debs-prefix.sh)
#        LLAMA_BIN=DIR       the llama.cpp build's bin/ (llama-bench, or llama-server with SERVE)
#        ISAS="amx avx512"   ember --isa values, one table each (OUT_DIR/table-ISA.md)
#        THREADS, PRESETS, TYPES, ROUNDS (default 1), REPS (default 2), FILTER: as in
#        quant_vs_llamacpp.sh; JOBS (default: cores)
# Keeps build-host/ and models/host/ (git ignores them) for the next call.
set -uo pipefail
OUT=${1:?usage: bench/host_cpu_bench.sh OUT_DIR}
mkdir -p "$OUT"
JOBS=${JOBS:-$(nproc)}
. "$(dirname "$0")/../scripts/debs-prefix.sh"
debs_prefix_env || exit 1
{ lscpu; echo; nproc; uname -r; } >"$OUT/host.txt" 2>&1
t0=$SECONDS
if [ -n "${SERVE:-}" ]; then
  ETARGETS=(ember loadgen) LTARGET=llama-server
else
  ETARGETS=(ember) LTARGET=llama-bench
fi
cmake -S . -B build-host -DCMAKE_BUILD_TYPE=Release "${CMAKE_EXTRA[@]}" >"$OUT/build-ember.log" 2>&1 &&
  cmake --build build-host -j"$JOBS" --target "${ETARGETS[@]}" >>"$OUT/build-ember.log" 2>&1 ||
  { echo "ember build failed (build-ember.log)"; exit 1; }
echo "ember built in $((SECONDS - t0)) s"
LLB=${LLAMA_BIN:-}/$LTARGET
[ -n "${LLAMA_BIN:-}" ] && [ -x "$LLB" ] || { echo "no $LTARGET: set LLAMA_BIN to a llama.cpp build's bin/"; exit 1; }
grep -o 'GGML_AMX[A-Z0-9_]*:BOOL=[A-Z]*\|GGML_NATIVE:BOOL=[A-Z]*' "$LLAMA_BIN/../CMakeCache.txt" >"$OUT/llama-flags.txt" 2>/dev/null
if [ -n "${SERVE:-}" ]; then
  M=models/host/q05-tok-q8_0.gguf
  if [ ! -f "$M" ]; then
    [ -f "${TOKENIZER_DIR:-}/tokenizer.json" ] || { echo "SERVE needs TOKENIZER_DIR with tokenizer.json"; exit 1; }
    "${RUN_ENV[@]}" build-host/ember mkmodel --preset qwen2.5-0.5b --dtype bf16 --out models/host/q05-tok >"$OUT/model.log" 2>&1 &&
      cp "$TOKENIZER_DIR"/tokenizer*.json models/host/q05-tok/ &&
      "${RUN_ENV[@]}" build-host/ember quantize --model models/host/q05-tok --type q8_0 --out "$M" >>"$OUT/model.log" 2>&1 ||
      { echo "writing $M failed (model.log)"; rm -f "$M"; exit 1; }
  fi
  for isa in ${ISAS:-amx avx512}; do
    for t in ${THREADS:-16 4}; do
      t0=$SECONDS
      "${RUN_ENV[@]}" env EMBER_ISA="$isa" PROMPT_VOCAB=151643 bash bench/serve_vs_llamacpp.sh build-host/ember "$LLB" \
        build-host/bench/loadgen "$M" "$SERVE" "$t" >"$OUT/serve-$isa-t$t.md" 2>"$OUT/serve-raw-$isa-t$t.log"
      echo "serving, ember --isa $isa, $t threads: $((SECONDS - t0)) s, exit $?"
    done
  done
  exit 0
fi
for isa in ${ISAS:-amx avx512}; do
  t0=$SECONDS
  "${RUN_ENV[@]}" env EMBER_ISA="$isa" bash bench/quant_vs_llamacpp.sh build-host/ember "$LLB" models/host \
    "${ROUNDS:-1}" "${REPS:-2}" "${FILTER:-.}" >"$OUT/table-$isa.md" 2>"$OUT/raw-$isa.log"
  echo "ember --isa $isa: $((SECONDS - t0)) s, exit $?"
done
