#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS each (default 3600: the long run).
#
#   scripts/fuzz.sh [SECONDS]          build with clang into build-fuzz, then fuzz
#   scripts/fuzz.sh --prepare BUILDDIR gather seed corpora and the demo model only
#
# Corpora live in BUILDDIR/corpus/<target>: the seeds in fuzz/corpus/<target>,
# data from ../shared when present (fixture configs, GGUF files, tokenizers,
# chat templates), and whatever the fuzzer finds. Crashes are written to
# BUILDDIR/crash-<target>-*; turn each into a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
shared=${EMBER_SHARED_DIR:-$root/../shared}

prepare() {
  local b=$1
  mkdir -p "$b/corpus"
  for t in safetensors config gguf gguf_model tokenizer template http kv_codec prompt_file toolcall gbnf; do
    mkdir -p "$b/corpus/$t"
    [ -d "fuzz/corpus/$t" ] && cp -n fuzz/corpus/$t/* "$b/corpus/$t/" 2>/dev/null || true
  done
  if [ -d "$shared" ]; then
    for f in "$shared"/fixtures/*/config.json; do cp -n "$f" "$b/corpus/config/$(basename "$(dirname "$f")").json"; done
    for f in "$shared"/testdata/models/*/*.gguf "$shared"/testdata/tokenizers/llama.cpp-vocab/ggml-vocab-{llama-spm,gpt-2}.gguf; do
      [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 2000000 ] && cp -n "$f" "$b/corpus/gguf/" && cp -n "$f" "$b/corpus/gguf_model/"
    done
    for f in "$shared"/testdata/chat-templates/llama.cpp/*.jinja; do cp -n "$f" "$b/corpus/template/"; done
    cp -n "$shared"/fixtures/llama/model.safetensors "$b/corpus/safetensors/llama.safetensors" 2>/dev/null || true
  fi
  # valid KV row blobs of the target's own caches
  if [ -x "$b/fuzz/fuzz_kv_codec" ] && [ ! -f "$b/corpus/kv_codec/seed0.bin" ]; then
    EMBER_FUZZ_KV_SEEDS="$b/corpus/kv_codec" "$b/fuzz/fuzz_kv_codec" -runs=1 "$b/corpus/kv_codec" >/dev/null 2>&1 || true
  fi
  # valid prompt cache files of the target's own caches
  if [ -x "$b/fuzz/fuzz_prompt_file" ] && [ ! -f "$b/corpus/prompt_file/seed0.bin" ]; then
    EMBER_FUZZ_PF_SEEDS="$b/corpus/prompt_file" "$b/fuzz/fuzz_prompt_file" -runs=1 "$b/corpus/prompt_file" >/dev/null 2>&1 || true
  fi
  [ -f "$b/fuzz_model/tokenizer.json" ] || "$b/ember" mkmodel --preset demo --out "$b/fuzz_model" >/dev/null
  if [ -f "$b/fuzz_model/tokenizer.json" ] && [ ! -f "$b/corpus/tokenizer/demo.bin" ]; then
    { cat "$b/fuzz_model/tokenizer.json"; printf '\xff\xfe\xfdHello <|im_start|> w\xc3\xb6rld 123'; } > "$b/corpus/tokenizer/demo.bin"
  fi
}

if [ "${1:-}" = "--prepare" ]; then
  prepare "$2"
  exit 0
fi
secs=${1:-3600}
bash scripts/deps.sh
CC=clang cmake -S . -B build-fuzz -DEMBER_FUZZ=ON -DEMBER_TESTS=OFF -DEMBER_FUZZ_SECONDS="$secs" -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j"$(nproc)"
prepare build-fuzz
(cd build-fuzz && ctest -L fuzz --output-on-failure --timeout $((secs + 300)))
