#!/bin/bash
# example_chat.sh BUILD SRC EMBER CC CFLAGS - examples/chat.c as an embedder
# builds it: libember installed (cmake --install) into BUILD/tests/tmp,
# the program compiled with that install's pkg-config file alone, run on the
# demo model (greedy), its reply compared with `ember generate --prompt`.
# Also checks that libember does not need libmicrohttpd (the server is not in
# the library).
set -euo pipefail
build=$1 src=$2 ember=$3 cc=$4 cflags=${5:-}
work=$build/tests/tmp/example_chat
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
pc=$(find "$work/prefix" -name ember.pc | head -1)
[ -n "$pc" ] || { echo "no ember.pc installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir ember)
[ -f "$libdir/libember.a" ] && ls "$libdir"/libember.so.* > /dev/null || { echo "libember.a / .so not in $libdir"; exit 1; }
if readelf -d "$libdir/libember.so" | grep -q microhttpd; then echo "libember.so needs libmicrohttpd"; exit 1; fi
if pkg-config --libs --static ember | grep -q microhttpd; then echo "ember.pc names libmicrohttpd"; exit 1; fi
# shellcheck disable=SC2046,SC2086
"$cc" $cflags -o "$work/chat" "$src/examples/chat.c" $(pkg-config --cflags --libs ember)
"$ember" mkmodel --preset demo --out "$work/model" > /dev/null
export LD_LIBRARY_PATH=$libdir
# greedy (the random demo model repeats one byte), then sampled (varied
# bytes, invalid UTF-8 included): the same text as the CLI's
for temp_seed in "0 0" "0.9 7"; do
  read -r temp seed <<< "$temp_seed"
  printf 'Tell me a story.\n' | "$work/chat" "$work/model" 24 "$temp" "$seed" > "$work/chat.out"
  "$ember" generate --model "$work/model" --prompt 'Tell me a story.' -n 24 --temp "$temp" --seed "$seed" > "$work/generate.out"
  if ! cmp -s "$work/chat.out" "$work/generate.out"; then
    echo "examples/chat (temperature $temp) differs from ember generate --prompt:"
    od -c "$work/chat.out" | head -5
    od -c "$work/generate.out" | head -5
    exit 1
  fi
done
# a second turn keeps the conversation: the first reply (sampled, as the
# last run above) comes out unchanged, and a second follows
printf 'Tell me a story.\nAnd then?\n' | "$work/chat" "$work/model" 24 0.9 7 > "$work/chat2.out"
head -c "$(stat -c %s "$work/generate.out")" "$work/chat2.out" | cmp -s - "$work/generate.out" ||
  { echo "the first turn changed with a second one"; exit 1; }
[ "$(stat -c %s "$work/chat2.out")" -gt "$(stat -c %s "$work/generate.out")" ] ||
  { echo "no second reply"; exit 1; }
echo "examples/chat (installed libember, pkg-config) matches ember generate --prompt ($(stat -c %s "$work/chat.out") bytes)"
