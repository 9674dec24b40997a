#!/usr/bin/env bash
# Builds ember and runs the whole test suite twice: an optimised build, then
# the same tests under AddressSanitizer + UndefinedBehaviorSanitizer.
# Installs the Debian packages it needs first (scripts/deps.sh).
#
# usage: scripts/test.sh            (from anywhere; build dirs go in the repo)
# env:   JOBS=N (default: cores), SKIP_SANITIZE=1 to run only the first pass
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
JOBS=${JOBS:-$(nproc)}

run_suite() { # build-dir cmake-args...
  local dir=$1; shift
  cmake -S . -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j"$JOBS"
  (cd "$dir" && ctest --output-on-failure --timeout 900)
}

echo "== release build"
run_suite build -DCMAKE_BUILD_TYPE=Release
if [ "${SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DEMBER_SANITIZE=ON
fi
echo "== all tests passed"
