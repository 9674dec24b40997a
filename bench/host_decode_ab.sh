#!/usr/bin/env bash
# host_decode_ab.sh - batched decode steps of two ember trees side by side on a machine without
# our Debian build dependencies (the GPU machine's 16-core host, through the device tool): the
# working tree and, from OLD_SRC (a `git archive` tarball of another commit), the old one.
# bench/decode_rows at ROWS rows and each THREADS count, the two binaries alternated ROUNDS times,
# then one run of each at the largest row count under EMBER_CPU_PROFILE (docs/backend.md; a tree
# older than commit 25f7836 writes no profile).
#
# usage: bench/host_decode_ab.sh OUT_DIR
# env:   EMBER_DEBS=DIR   .deb files of our build dependencies (scripts/debs-prefix.sh)
#        OLD_SRC=FILE     the old tree (.tar.gz from `git archive REV | gzip`); without it, the new only
#        PRESET (default qwen2.5-0.5b), TYPE (default q8_0): the model, `ember mkmodel` + `ember quantize`
#        ROWS (default 1,16,64), THREADS (default "16 4"), ROUNDS (default 2), DEPTH (default 128),
#        STEPS (default 32), JOBS (default: cores)
# Writes OUT_DIR/steps.txt (one line per run: round, threads, tree, the decode_rows rows) and
# OUT_DIR/prof-TREE-tT.md; keeps build-host/, build-host-old/ and models/host/ (git ignores them).
set -uo pipefail
OUT=${1:?usage: bench/host_decode_ab.sh OUT_DIR}
mkdir -p "$OUT"
JOBS=${JOBS:-$(nproc)}
. "$(dirname "$0")/../scripts/debs-prefix.sh"
debs_prefix_env || exit 1
# build SRC DIR NAME: ember and decode_rows, the log in OUT_DIR/build-NAME.log
build() {
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release "${CMAKE_EXTRA[@]}" >"$OUT/build-$3.log" 2>&1 &&
    cmake --build "$2" -j"$JOBS" --target ember decode_rows >>"$OUT/build-$3.log" 2>&1
}
TREES=(new)
build . build-host new || { echo "build failed (build-new.log)"; exit 1; }
if [ -n "${OLD_SRC:-}" ]; then
  rm -rf build-host-old && mkdir -p build-host-old/src && tar -xzf "$OLD_SRC" -C build-host-old/src &&
    build build-host-old/src build-host-old/b old || { echo "old build failed (build-old.log)"; exit 1; }
  TREES=(old new)
fi
bin() { [ "$1" = old ] && echo build-host-old/b/bench/decode_rows || echo build-host/bench/decode_rows; }
P=${PRESET:-qwen2.5-0.5b} T=${TYPE:-q8_0}
M=models/host/$P-$T.gguf
mkdir -p models/host
[ -f "models/host/$P/model.safetensors" ] ||
  "${RUN_ENV[@]}" build-host/ember mkmodel --preset "$P" --dtype bf16 --out "models/host/$P" >"$OUT/model.log" 2>&1
[ -f "$M" ] || "${RUN_ENV[@]}" build-host/ember quantize --model "models/host/$P" --type "$T" --out "$M" >>"$OUT/model.log" 2>&1 ||
  { echo "writing $M failed (model.log)"; rm -f "$M"; exit 1; }
ARGS=(--model "$M" --depth "${DEPTH:-128}" --steps "${STEPS:-32}" --argmax 1)
{ lscpu | sed -n 's/^Model name: *//p'; nproc; uptime; } >"$OUT/host.txt"
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
  for t in ${THREADS:-16 4}; do
    for tree in "${TREES[@]}"; do
      "${RUN_ENV[@]}" "$(bin "$tree")" "${ARGS[@]}" --rows "${ROWS:-1,16,64}" --threads "$t" | grep '^| *[0-9]' |
        sed "s/^/round $r, $t threads, $tree: /" >>"$OUT/steps.txt"
    done
  done
done
last=${ROWS:-1,16,64}
last=${last##*,}
for t in ${THREADS:-16 4}; do
  for tree in "${TREES[@]}"; do
    EMBER_CPU_PROFILE="$OUT/prof-$tree-t$t.md" "${RUN_ENV[@]}" "$(bin "$tree")" "${ARGS[@]}" --rows "$last" --threads "$t" \
      >/dev/null
  done
done
uptime >>"$OUT/host.txt"
cat "$OUT/steps.txt"
