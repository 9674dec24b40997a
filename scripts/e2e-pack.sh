#!/usr/bin/env bash
# e2e-pack.sh - packs what the server's end-to-end SDK test needs (tests/e2e/sdk_test.mjs: a node
# binary and the SDKs of tests/e2e/package-lock.json) into a folder, for a machine without node or
# network (the GPU machine: scripts/gpu-test.sh with E2E_PACK=DIR unpacks and runs it there).
#
# usage: scripts/e2e-pack.sh [DIR]      (default build-e2e, which git ignores; needs node and npm here)
# Writes DIR/node.tar.xz (this machine's node binary, which must not need more than the C and C++
# runtime libraries: checked with ldd) and DIR/e2e-modules.tar.xz (tests/e2e/node_modules, made by
# npm ci when absent). Exit status non-zero, with a line on stderr, when either cannot be made.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-e2e}
NODE=$(command -v node) || { echo "e2e-pack: no node here" >&2; exit 1; }
NODE=$(readlink -f "$NODE")
# a node that loads its own shared libraries (libnode, libuv, ...) would not run elsewhere
if ldd "$NODE" | grep -v -E 'linux-vdso|ld-linux|lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so' | grep -q '=>'; then
  echo "e2e-pack: $NODE needs more than the C/C++ runtime:" >&2
  ldd "$NODE" >&2
  exit 1
fi
if [ ! -d tests/e2e/node_modules ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi
mkdir -p "$DIR"
tar -cJf "$DIR/node.tar.xz" -C "$(dirname "$NODE")" "$(basename "$NODE")"
tar -cJf "$DIR/e2e-modules.tar.xz" -C tests/e2e node_modules
echo "e2e-pack: $(du -sh "$DIR" | cut -f1) in $DIR (node $("$NODE" --version))"
