#!/usr/bin/env bash
# host_cpu_bench.sh - bench/quant_vs_llamacpp.sh on a machine that has neither our Debian
# build dependencies nor llama.cpp: the GPU machine's host CPU (a many-core Xeon with
# AVX-512 and AMX), reached through the device tool. Builds ember (CPU only) and, from a
# llama.cpp source tarball made outside this repository, llama-bench with GGML_NATIVE=ON
# (so with AMX where the CPU has it); writes the models once; then runs the side by side
# once per ember ISA. With SERVE set, serving instead: bench/serve_vs_llamacpp.sh against
# llama-server (built the same way) on the Qwen2.5-0.5B shape in Q8_0 with a real tokenizer.
#
# usage: bench/host_cpu_bench.sh OUT_DIR
# env:   EMBER_DEBS=DIR      .deb files of our build dependencies (scripts/debs-prefix.sh)
#        LLAMA_SRC=FILE      llama.cpp sources (.tar.xz), built into build-llama/ once
#        ISAS="amx avx512"   ember --isa values, one table each (OUT_DIR/table-ISA.md)
#        THREADS, PRESETS, TYPES, ROUNDS (default 1), REPS (default 2), FILTER: as in
#        quant_vs_llamacpp.sh; JOBS (default: cores)
# Keeps build-host/, build-llama/ and models/host/ (git ignores them) for the next call.
set -uo pipefail
OUT=${1:?usage: bench/host_cpu_bench.sh OUT_DIR}
mkdir -p "$OUT"
JOBS=${JOBS:-$(nproc)}
. "$(dirname "$0")/../scripts/debs-prefix.sh"
debs_prefix_env || exit 1
{ lscpu; echo; nproc; uname -r; } >"$OUT/host.txt" 2>&1
t0=$SECONDS
if [ -n "${SERVE:-}" ]; then
  ETARGETS=(ember loadgen) LTARGET=llama-server LSERVER=ON
else
  ETARGETS=(ember) LTARGET=llama-bench LSERVER=OFF
fi
cmake -S . -B build-host -DCMAKE_BUILD_TYPE=Release "${CMAKE_EXTRA[@]}" >"$OUT/build-ember.log" 2>&1 &&
  cmake --build build-host -j"$JOBS" --target "${ETARGETS[@]}" >>"$OUT/build-ember.log" 2>&1 ||
  { echo "ember build failed (build-ember.log)"; exit 1; }
echo "ember built in $((SECONDS - t0)) s"
LLB=build-llama/bin/$LTARGET
if [ ! -x "$LLB" ] && [ -n "${LLAMA_SRC:-}" ]; then
  t0=$SECONDS
  { [ -f build-llama/src/CMakeLists.txt ] || { mkdir -p build-llama/src && tar -xJf "$LLAMA_SRC" -C build-llama/src; }; } &&
    cmake -S build-llama/src -B build-llama -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=$LSERVER -DLLAMA_BUILD_APP=OFF >"$OUT/build-llama.log" 2>&1 &&
    cmake --build build-llama -j"$JOBS" --target "$LTARGET" >>"$OUT/build-llama.log" 2>&1 ||
    { echo "llama.cpp build failed (build-llama.log)"; tail -20 "$OUT/build-llama.log"; exit 1; }
  echo "$LTARGET built in $((SECONDS - t0)) s"
fi
[ -x "$LLB" ] || { echo "no $LTARGET: set LLAMA_SRC"; exit 1; }
grep -o 'GGML_AMX[A-Z0-9_]*:BOOL=[A-Z]*\|GGML_NATIVE:BOOL=[A-Z]*' build-llama/CMakeCache.txt >"$OUT/llama-flags.txt" 2>/dev/null
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
