#!/usr/bin/env bash
# Builds ember and runs the whole test suite twice with gcc: an optimised
# build, then the same tests under AddressSanitizer + UndefinedBehaviorSanitizer.
# Installs the Debian packages it needs first (scripts/deps.sh).
#
# usage: scripts/test.sh            (from anywhere; build dirs go in the repo)
# A third pass builds the whole tree with clang and runs every libFuzzer target
# for a bounded time. Warnings are errors in every pass (-DEMBER_WERROR=ON).
# env:   JOBS=N (default: cores), SKIP_SANITIZE=1 / SKIP_FUZZ=1 / SKIP_CUDA=1 to leave a pass out,
#        FUZZ_SECONDS=N per fuzz target (default 20; scripts/fuzz.sh runs them for hours),
#        SOAK_SECONDS=N / ASAN_SOAK_SECONDS=N the soak's length in each pass (default 90 / 20;
#        longer by hand: build/tests/soak build/ember MODEL_DIR SECONDS). docs/testing.md
#        says where CI's time goes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
JOBS=${JOBS:-$(nproc)}
# the SDKs of the end-to-end test (pinned in tests/e2e/package-lock.json)
if [ ! -d tests/e2e/node_modules ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi

# Every build here is a developer/CI build: warnings are errors (EMBER_WERROR).
run_suite() { # build-dir cmake-args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DEMBER_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$JOBS"
  (cd "$dir" && ctest --output-on-failure --timeout 900)
}

# The CUDA backend where the toolkit is installed (CI has nvcc, no GPU): the
# release build is then a CUDA build (-DEMBER_CUDA=ON), so the backend compiles
# with -Werror and the GPU tests run, skipping (77, "skipped: no CUDA device")
# without a GPU; every CPU test runs in the same build. The sanitizer and fuzz
# builds below stay without CUDA, so the stub backend (cuda_stub.c) compiles and
# runs too. scripts/gpu-test.sh is the full run on a GPU machine.
NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
RELEASE_CUDA=()
if [ -n "$NVCC" ] && [ "${SKIP_CUDA:-0}" != 1 ]; then
  RELEASE_CUDA=(-DEMBER_CUDA=ON)
  export PATH=$PATH:$(dirname "$NVCC")
fi
echo "== release build${RELEASE_CUDA:+ with the CUDA backend ($NVCC)}"
SOAK_SECONDS=${SOAK_SECONDS:-90} run_suite build -DCMAKE_BUILD_TYPE=Release "${RELEASE_CUDA[@]}"
if [ "${SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
  # ASan's quarantine grows RSS by design: the soak's RSS check is lifted here and
  # LeakSanitizer (non-zero exit of the server on a leak) does that job instead
  SOAK_SECONDS=${ASAN_SOAK_SECONDS:-20} SOAK_MAX_RSS_SLOPE_KIB=1000000000 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DEMBER_SANITIZE=ON
fi
if [ "${SKIP_FUZZ:-0}" != 1 ]; then
  echo "== fuzz targets (clang, libFuzzer + ASan + UBSan, ${FUZZ_SECONDS:-20} s each)"
  # This is CI's clang build: the whole tree (library, CLI, tests, benchmarks)
  # compiles here with clang and -Werror; only the fuzz targets run (the tests
  # ran above under gcc). Building the tests and benchmarks too adds ~12 s
  # (measured on 2 cores: 44 s for the whole tree, 33 s for the library, CLI
  # and fuzz targets alone).
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DEMBER_FUZZ=ON -DEMBER_TESTS=ON -DEMBER_WERROR=ON \
    -DEMBER_FUZZ_SECONDS="${FUZZ_SECONDS:-20}" >/dev/null
  cmake --build build-fuzz -j"$JOBS"
  # the targets are independent (a corpus and crash prefix each) and single-threaded:
  # JOBS of them at a time, each for its whole FUZZ_SECONDS
  (cd build-fuzz && ctest -L fuzz -j"$JOBS" --output-on-failure)
fi
echo "== all tests passed"
