#!/usr/bin/env bash
# Installs the Debian 12 packages ember needs to build and test.
# Skips apt entirely when everything is already there; uses sudo when not root.
set -euo pipefail

PKGS=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      clang libclang-rt-14-dev)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the reference implementations some tests compare with;
# any installation of them will do (Debian's, or one that bundles npm).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
