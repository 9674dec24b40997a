#!/usr/bin/env bash
# The one script for a GPU machine: builds ember with the CUDA backend, runs
# the GPU tests (ctest -R cuda), runs them again under compute-sanitizer
# (memcheck, racecheck, initcheck), runs the GPU benchmark
# (bench/cuda_ops_bench.c), and writes logs and a results table to a folder.
#
# usage: scripts/gpu-test.sh [OUTDIR]     (default: $OUT when set, else gpu-results)
# env:   EMBER_DEBS=DIR   .deb files of the build dependencies (jansson,
#                         libmicrohttpd, pcre2, utf8proc, pkgconf and their
#                         libraries), unpacked into a private prefix for a
#                         machine that lacks them (docs/cuda.md says which)
#        JOBS=N (default: cores), BUILD_DIR (default: build-cuda),
#        EMBER_GPU_WERROR=OFF (warnings stay warnings; default ON, a developer build),
#        SKIP_TESTS=1 (no ctest, no test_kv_rec: a measuring run), SKIP_SANITIZE=1, SKIP_MODEL_SANITIZE=1,
#        SKIP_OPS_BENCH=1, BENCH_ARGS (e.g. "--quick"), SANITIZE_TIMEOUT / BENCH_TIMEOUT
#        DECODE_ROWS="llama3.1-8b": aggregate decode at 1..256 rows (bench/decode_rows.c)
#        DECODE_ROWS_ALSO="ENVS|ARGS;ENVS|ARGS": more decode_rows runs of each DECODE_ROWS preset, each
#                         with the variables ENVS set and ARGS added (e.g. "|--argmax 1;EMBER_CUDA_MM_CLUSTER=0|")
#        PROFILE_ROWS="64": for each DECODE_ROWS preset, decode_rows again at that many rows
#                         under EMBER_CUDA_PROFILE (GPU time per op) into profile-PRESET.md
#        EMBER_SHARED_DIR=DIR: the fixtures for the model test (a copy inside the
#                         checkout when ../shared does not travel to the GPU machine)
#        MODEL_BENCH="llama3.2-1b llama3.1-8b": whole-model ember bench on the GPU (mkmodel presets)
#        MODEL_QUANT="q4_0 q4_k_m": each MODEL_BENCH preset also quantized (ember quantize) to these
#                         GGUF types and benched the same way
#        MODEL_BENCH_ALSO="ENVS;ENVS": each MODEL_BENCH preset benched again once per item, with the
#                         variables ENVS set (e.g. "EMBER_CUDA_ATTN_TC=0": the attention of before)
#        SKIP_CUBLAS=1: no cuBLAS reference (bench/cublas_ref.c, built where the toolkit has cuBLAS:
#                         its bf16 GEMM rate on the models' shapes, into cublas.txt)
#        E2E_PACK=DIR: node and the SDKs packed by scripts/e2e-pack.sh (carried to the GPU machine):
#                         the server's end-to-end SDK test with --device E2E_DEVICE (default cuda:0), sdk.log
#        (seconds per sanitizer run / for the benchmark; 200 / 240)
# Files written: results.md (machine, versions, outcome of each step, the
# benchmark table), build.log, test.log, memcheck.log, racecheck.log,
# racecheck-attention_lean.log, racecheck-sample.log,
# initcheck.log, bench.txt, cublas.txt, sdk.log. Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-gpu-results}}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD_DIR:-build-cuda}
export PATH=$PATH:/usr/local/cuda/bin
RES=$OUTDIR/results.md
status=0

note() { echo "$*" | tee -a "$RES"; }
# step NAME LOG CMD...: runs CMD with its output in LOG, records the outcome
step() {
  local name=$1 log=$2; shift 2
  local t0=$SECONDS rc
  "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then note "- $name: ok ($((SECONDS - t0)) s)"
  else note "- $name: FAILED, exit $rc ($((SECONDS - t0)) s; $(basename "$log"))"; status=1; fi
  return $rc
}

: >"$RES"
note "# ember GPU test, $(date -u '+%Y-%m-%d %H:%M UTC')"
note ""
note "- commit: $(cat GIT_REV 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | head -1)"
note "- nvcc: $(nvcc --version 2>&1 | grep -o 'release [0-9.]*, V[0-9.]*')"
note "- host: $(uname -m), $(nproc) cores, $(gcc --version | head -1), $(cmake --version | head -1)"
note ""

# ---- build dependencies from .deb files, when asked ----------------------------------
CMAKE_EXTRA=()
RUN_ENV=()
if [ -n "${EMBER_DEBS:-}" ]; then
  PREFIX=${EMBER_DEPS_PREFIX:-/tmp/ember-deps}
  . "$(dirname "$0")/debs-prefix.sh"
  debs_prefix "$EMBER_DEBS" "$PREFIX" 2>>"$RES" || { note "- unpacking the .deb files: FAILED"; exit 1; }
  note "- dependencies: $(ls "$EMBER_DEBS"/*.deb | wc -l) .deb files unpacked into $PREFIX"
fi

# ---- build ----------------------------------------------------------------------------------
build() {
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON -DEMBER_WERROR="${EMBER_GPU_WERROR:-ON}" "${CMAKE_EXTRA[@]}" \
    ${EMBER_SHARED_DIR:+-DEMBER_SHARED_DIR="$EMBER_SHARED_DIR"} &&
    cmake --build "$BUILD" -j"$JOBS" --target test_cuda_ops test_cuda_model test_kv_rec cuda_ops_bench decode_rows ember
}
if ! step "build (-DEMBER_CUDA=ON; test_cuda_ops, test_cuda_model, test_kv_rec, cuda_ops_bench, ember)" "$OUTDIR/build.log" build; then
  tail -30 "$OUTDIR/build.log"
  exit 1
fi
# the cuBLAS reference (measuring only; absent where the toolkit has no cuBLAS)
if [ "${SKIP_CUBLAS:-0}" != 1 ]; then
  cmake --build "$BUILD" -j"$JOBS" --target cublas_ref >>"$OUTDIR/build.log" 2>&1 ||
    note "- cublas_ref: not built (no cuBLAS in the toolkit?)"
fi
# the kernels' registers and spills, from the compiler's report of the built object
if command -v cuobjdump >/dev/null; then
  { echo; echo "kernel resources (cuobjdump --dump-resource-usage):";
    find "$BUILD" -name 'cuda_*.cu.o' -exec cuobjdump --dump-resource-usage {} \; 2>&1 | head -200; } \
    >>"$OUTDIR/build.log"
fi

# ---- tests ----------------------------------------------------------------------------------
# e2e_sdk: node and the SDKs unpacked from E2E_PACK (scripts/e2e-pack.sh), the demo model made, and
# sdk_test.mjs run with every server on E2E_DEVICE (default cuda:0), which /v1/models must name
e2e_sdk() {
  local nd=/tmp/ember-e2e-node dev=${E2E_DEVICE:-cuda:0}
  mkdir -p "$nd" && tar -xJf "$E2E_PACK/node.tar.xz" -C "$nd" && tar -xJf "$E2E_PACK/e2e-modules.tar.xz" -C tests/e2e &&
    "${RUN_ENV[@]}" "$BUILD/ember" mkmodel --preset demo --out "$BUILD/e2e_demo" &&
    EMBER_E2E_SERVE_ARGS="--device $dev" EMBER_E2E_DEVICE=$dev "${RUN_ENV[@]}" "$nd/node" tests/e2e/sdk_test.mjs \
      "$BUILD/ember" "$BUILD/e2e_demo" ${EMBER_SHARED_DIR:+"$EMBER_SHARED_DIR"}
}
TEST=$BUILD/tests/test_cuda_ops
MODEL_TEST=$BUILD/tests/test_cuda_model
if [ "${SKIP_TESTS:-0}" != 1 ]; then
step "ctest -R cuda" "$OUTDIR/test.log" "${RUN_ENV[@]}" bash -c "cd '$BUILD' && ctest -R cuda --output-on-failure -V --timeout 300"
grep -E 'checks,|skipped' "$OUTDIR/test.log" | sed 's/^[0-9]*: //' | sed 's/^/  /' | tee -a "$RES"
if grep -q 'skipped: no CUDA device' "$OUTDIR/test.log"; then note "  (no CUDA device: the GPU tests were skipped)"; status=1; fi
# recurrent state rows (hybrid models) on cpu and cuda:0: the cache contract through delta_net / delta_replay
step "test_kv_rec (cpu, cuda:0)" "$OUTDIR/kv_rec.log" "${RUN_ENV[@]}" "$BUILD/tests/test_kv_rec"
grep -E 'checks,|^cpu:|^cuda:0:' "$OUTDIR/kv_rec.log" | sed 's/^/  /' | tee -a "$RES"
# the server's end-to-end SDK test with every server on the GPU, where E2E_PACK brings node and the SDKs
if [ -n "${E2E_PACK:-}" ]; then
  step "SDK end-to-end test (tests/e2e/sdk_test.mjs), ember serve --device ${E2E_DEVICE:-cuda:0}" "$OUTDIR/sdk.log" e2e_sdk
  grep -E 'checks,|FAIL|skip' "$OUTDIR/sdk.log" | sed 's/^/  /' | tee -a "$RES"
fi
fi

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer \
      /usr/local/cuda/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
[ "${SKIP_TESTS:-0}" = 1 ] && SKIP_SANITIZE=1
if [ "${SKIP_SANITIZE:-0}" != 1 ] && [ -z "$SAN" ]; then note "- compute-sanitizer: NOT FOUND"; status=1; fi
if [ "${SKIP_SANITIZE:-0}" != 1 ] && [ -n "$SAN" ]; then
  for tool in memcheck racecheck initcheck; do
    extra=()
    [ $tool = memcheck ] && extra=(--leak-check full)
    step "compute-sanitizer --tool $tool" "$OUTDIR/$tool.log" "${RUN_ENV[@]}" \
      timeout "${SANITIZE_TIMEOUT:-200}" "$SAN" --tool $tool "${extra[@]}" --error-exitcode 99 "$TEST"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|checks,' "$OUTDIR/$tool.log" | sed 's/^/  /' | tee -a "$RES"
    [ $tool = memcheck ] && step "compute-sanitizer --tool memcheck test_kv_rec" "$OUTDIR/memcheck-kv_rec.log" \
      "${RUN_ENV[@]}" timeout "${SANITIZE_TIMEOUT:-200}" "$SAN" --tool memcheck --error-exitcode 99 "$BUILD/tests/test_kv_rec"
    # the decode attention (lean kernel) alone: the whole kv_attention group outlasts racecheck's time
    [ $tool = racecheck ] && step "compute-sanitizer --tool racecheck test_cuda_ops (attention_lean)" \
      "$OUTDIR/racecheck-attention_lean.log" "${RUN_ENV[@]}" env EMBER_CUDA_OPS_ONLY=attention_lean \
      timeout "${SANITIZE_TIMEOUT:-200}" "$SAN" --tool racecheck --error-exitcode 99 "$TEST" &&
      grep -E 'RACECHECK SUMMARY|checks,' "$OUTDIR/racecheck-attention_lean.log" | sed 's/^/  /' | tee -a "$RES"
    # the clustered device draw alone (clusters of 8, the 37-id rows: the full sample group outlasts it too)
    [ $tool = racecheck ] && step "compute-sanitizer --tool racecheck test_cuda_ops (sample, clusters of 8)" \
      "$OUTDIR/racecheck-sample.log" "${RUN_ENV[@]}" env EMBER_CUDA_OPS_ONLY=sample EMBER_CUDA_SAMPLE_SMALL=1 \
      EMBER_CUDA_SAMPLE_CLUSTERS=8 timeout "${SANITIZE_TIMEOUT:-200}" "$SAN" --tool racecheck --error-exitcode 99 \
      "$TEST" && grep -E 'RACECHECK SUMMARY|checks,' "$OUTDIR/racecheck-sample.log" | sed 's/^/  /' | tee -a "$RES"
    # the model test (three families) through the same tool
    [ "${SKIP_MODEL_SANITIZE:-0}" = 1 ] && continue
    step "compute-sanitizer --tool $tool test_cuda_model (quick)" "$OUTDIR/$tool-model.log" "${RUN_ENV[@]}" \
      env EMBER_CUDA_MODEL_QUICK=1 timeout "${SANITIZE_TIMEOUT:-200}" "$SAN" --tool $tool "${extra[@]}" \
      --error-exitcode 99 "$MODEL_TEST"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|checks,' "$OUTDIR/$tool-model.log" | sed 's/^/  /' |
      tee -a "$RES"
  done
fi

# ---- benchmark ----------------------------------------------------------------------------------
note ""
if [ "${SKIP_OPS_BENCH:-0}" != 1 ]; then
  if step "bench/cuda_ops_bench ${BENCH_ARGS:-}" "$OUTDIR/bench.txt" "${RUN_ENV[@]}" \
    timeout "${BENCH_TIMEOUT:-240}" "$BUILD/bench/cuda_ops_bench" ${BENCH_ARGS:-}; then :; fi
  note ""
  cat "$OUTDIR/bench.txt" >>"$RES"
  cat "$OUTDIR/bench.txt"
fi
note ""

if [ "${SKIP_CUBLAS:-0}" != 1 ] && [ -x "$BUILD/bench/cublas_ref" ]; then
  step "bench/cublas_ref (cuBLAS bf16 GEMM reference)" "$OUTDIR/cublas.txt" "${RUN_ENV[@]}" \
    timeout "${BENCH_TIMEOUT:-240}" "$BUILD/bench/cublas_ref"
  cat "$OUTDIR/cublas.txt" | tee -a "$RES"
  note ""
fi

# ensure_model PRESET: writes $MD/PRESET (ember mkmodel, bf16) unless it is there
ensure_model() {
  [ -d "$MD/$1" ] || step "mkmodel $1 bf16" "$OUTDIR/mkmodel-$1.log" "${RUN_ENV[@]}" \
    "$BUILD/ember" mkmodel --preset "$1" --dtype bf16 --out "$MD/$1"
}

# ---- whole models: ember bench --device cuda:0 on random weights of real shapes ---------------------
# MODEL_BENCH="llama3.2-1b llama3.1-8b" (presets of ember mkmodel, bf16), MODEL_BENCH_ARGS (default
# "-p 512 -n 128 -r 3"); the models are written to MODEL_DIR (default /tmp/ember-models).
if [ -n "${MODEL_BENCH:-}" ]; then
  MD=${MODEL_DIR:-/tmp/ember-models}
  mkdir -p "$MD"
  for preset in $MODEL_BENCH; do
    ensure_model "$preset"
    step "ember bench --device cuda:0 $preset" "$OUTDIR/model-bench-$preset.txt" "${RUN_ENV[@]}" \
      timeout "${BENCH_TIMEOUT:-240}" "$BUILD/ember" bench --device cuda:0 --model "$MD/$preset" \
      ${MODEL_BENCH_ARGS:--p 512 -n 128 -r 3}
    { echo "$preset bf16, ember bench --device cuda:0 ${MODEL_BENCH_ARGS:--p 512 -n 128 -r 3}:"; cat "$OUTDIR/model-bench-$preset.txt"; echo; } |
      tee -a "$RES"
    IFS=';' read -ra also <<<"${MODEL_BENCH_ALSO:-}"
    for i in "${!also[@]}"; do
      step "ember bench --device cuda:0 $preset (${also[$i]})" "$OUTDIR/model-bench-$preset-$i.txt" "${RUN_ENV[@]}" \
        env ${also[$i]} timeout "${BENCH_TIMEOUT:-240}" "$BUILD/ember" bench --device cuda:0 --model "$MD/$preset" \
        ${MODEL_BENCH_ARGS:--p 512 -n 128 -r 3}
      { echo "$preset bf16, ${also[$i]} ember bench --device cuda:0 ${MODEL_BENCH_ARGS:--p 512 -n 128 -r 3}:";
        cat "$OUTDIR/model-bench-$preset-$i.txt"; echo; } | tee -a "$RES"
    done
    # MODEL_QUANT="q4_0 q4_k_m q8_0": the preset quantized by ember quantize, benched the same way
    for qt in ${MODEL_QUANT:-}; do
      qf="$MD/$preset-$qt.gguf"
      [ -f "$qf" ] || step "quantize $preset $qt" "$OUTDIR/quantize-$preset-$qt.log" "${RUN_ENV[@]}" \
        "$BUILD/ember" quantize --model "$MD/$preset" --type "$qt" --out "$qf"
      step "ember bench --device cuda:0 $preset $qt" "$OUTDIR/model-bench-$preset-$qt.txt" "${RUN_ENV[@]}" \
        timeout "${BENCH_TIMEOUT:-240}" "$BUILD/ember" bench --device cuda:0 --model "$qf" \
        ${MODEL_BENCH_ARGS:--p 512 -n 128 -r 3}
      { echo "$preset $qt, ember bench --device cuda:0 ${MODEL_BENCH_ARGS:--p 512 -n 128 -r 3}:";
        cat "$OUTDIR/model-bench-$preset-$qt.txt"; echo; } | tee -a "$RES"
    done
  done
fi
# DECODE_ROWS="llama3.1-8b": aggregate decode (bench/decode_rows.c) on those presets,
# DECODE_ROWS_ARGS (default "--rows 1,8,64,256 --depth 1024 --steps 16 --kv-type bf16")
if [ -n "${DECODE_ROWS:-}" ]; then
  MD=${MODEL_DIR:-/tmp/ember-models}
  mkdir -p "$MD"
  for preset in $DECODE_ROWS; do
    ensure_model "$preset"
    step "decode_rows --device cuda:0 $preset" "$OUTDIR/decode-rows-$preset.txt" "${RUN_ENV[@]}" \
      timeout "${BENCH_TIMEOUT:-240}" "$BUILD/bench/decode_rows" --device cuda:0 --model "$MD/$preset" \
      ${DECODE_ROWS_ARGS:---rows 1,8,64,256 --depth 1024 --steps 16 --kv-type bf16}
    cat "$OUTDIR/decode-rows-$preset.txt" | tee -a "$RES"
    IFS=';' read -ra also <<<"${DECODE_ROWS_ALSO:-}"
    for i in "${!also[@]}"; do
      item=${also[$i]} envs=${also[$i]%%|*} args=
      [[ $item == *"|"* ]] && args=${item#*|}
      step "decode_rows --device cuda:0 $preset ($item)" "$OUTDIR/decode-rows-$preset-$i.txt" "${RUN_ENV[@]}" \
        env $envs timeout "${BENCH_TIMEOUT:-240}" "$BUILD/bench/decode_rows" --device cuda:0 --model "$MD/$preset" \
        ${DECODE_ROWS_ARGS:---rows 1,8,64,256 --depth 1024 --steps 16 --kv-type bf16} $args
      { echo "decode_rows, environment '$envs', arguments added '$args':"; cat "$OUTDIR/decode-rows-$preset-$i.txt"; } |
        tee -a "$RES"
    done
    for pr in ${PROFILE_ROWS:-}; do
      rm -f "$OUTDIR/profile-$preset.md"
      step "decode_rows --rows $pr under EMBER_CUDA_PROFILE $preset" "$OUTDIR/profile-run-$preset.txt" "${RUN_ENV[@]}" \
        env EMBER_CUDA_PROFILE="$OUTDIR/profile-$preset.md" timeout "${BENCH_TIMEOUT:-240}" "$BUILD/bench/decode_rows" \
        --device cuda:0 --model "$MD/$preset" ${DECODE_ROWS_ARGS:---depth 1024 --kv-type bf16} --rows "$pr" --steps 4
      { echo "$preset, $pr rows, EMBER_CUDA_PROFILE (prefill of 1,024 tokens, 5 steps):"; cat "$OUTDIR/profile-$preset.md"; } |
        tee -a "$RES"
    done
  done
fi
note "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
