# debs-prefix.sh - sourced by scripts that build ember on a machine without our Debian
# build dependencies (the GPU machine): debs_prefix DEBDIR [PREFIX] unpacks every .deb
# in DEBDIR (jansson, libmicrohttpd, pcre2, utf8proc, pkgconf and their libraries) into
# PREFIX (default /tmp/ember-deps) and sets
#   CMAKE_EXTRA  cmake arguments: that prefix's pkg-config, and its libraries for the linker
#   RUN_ENV      a command prefix (env LD_LIBRARY_PATH=...) for running what was built.
# Returns non-zero, with a line on stderr, when a .deb does not unpack.
debs_prefix() {
  local debs=$1 prefix=${2:-/tmp/ember-deps} f
  mkdir -p "$prefix/bin"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix" || { echo "unpacking $f failed" >&2; return 1; }; done
  local lib=$prefix/usr/lib/x86_64-linux-gnu
  local pc=$lib/pkgconfig
  # libmicrohttpd.pc names gnutls (Requires.private); nothing of it is needed to build
  [ -f "$pc/gnutls.pc" ] || printf 'Name: gnutls\nDescription: stub\nVersion: 3.7.9\nLibs:\nCflags:\n' >"$pc/gnutls.pc"
  # pkg-config from the prefix, seeing only the prefix's .pc files, paths moved into it
  cat >"$prefix/bin/pkg-config" <<EOT
#!/bin/sh
export LD_LIBRARY_PATH=$lib PKG_CONFIG_LIBDIR=$pc:$prefix/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
exec $prefix/usr/bin/pkgconf "\$@"
EOT
  chmod +x "$prefix/bin/pkg-config"
  # the linker finds the libraries' own dependencies there; the programs we run load them from there
  CMAKE_EXTRA=(-DPKG_CONFIG_EXECUTABLE="$prefix/bin/pkg-config" "-DCMAKE_EXE_LINKER_FLAGS=-Xlinker -rpath-link=$lib")
  RUN_ENV=(env "LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
}

# debs_prefix_env: CMAKE_EXTRA and RUN_ENV for the bench scripts that build on a host: empty
# where EMBER_DEBS is unset (the machine has our packages), else debs_prefix "$EMBER_DEBS".
# Returns non-zero when the .deb files do not unpack.
debs_prefix_env() {
  CMAKE_EXTRA=()
  RUN_ENV=()
  [ -z "${EMBER_DEBS:-}" ] || debs_prefix "$EMBER_DEBS"
}
