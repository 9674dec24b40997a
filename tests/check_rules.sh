#!/usr/bin/env bash
# The grep-able house rules of docs/rules.md.
set -u
cd "$(dirname "$0")/.."
fail=0
hits=$(grep -rnE '\bassert[[:space:]]*\(|#[[:space:]]*include[[:space:]]*<assert\.h>' src/ | grep -vE 'static_assert|_Static_assert')
if [ -n "$hits" ]; then
  echo "assert() in the product (docs/rules.md):"; echo "$hits"; fail=1
fi
prints=$(grep -rnE '\b(printf|puts|perror)[[:space:]]*\(|fprintf[[:space:]]*\([[:space:]]*(stdout|stderr)' src/ | grep -v '^src/cli/')
if [ -n "$prints" ]; then
  echo "printing outside src/cli (docs/rules.md):"; echo "$prints"; fail=1
fi
allocs=$(grep -rnE '\b(malloc|calloc|realloc|aligned_alloc|strdup|strndup)[[:space:]]*\(' src/ --include='*.c' --include='*.h' \
         | grep -v '^src/cli/' | grep -v '^src/core/fault.c:')
if [ -n "$allocs" ]; then
  echo "allocation outside ember_malloc and friends (docs/rules.md, src/core/alloc.h):"; echo "$allocs"; fail=1
fi
# No function outside the kernels (src/backend/*/kern_*, .cu) over 150 lines
# (issue 17): a reader holds a function whole.
long=$(find src -name '*.[ch]' ! -path 'src/backend/*/kern_*' | sort | xargs awk -v max=150 -f tests/function_lengths.awk | sort -rn)
if [ -n "$long" ]; then
  echo "functions over 150 lines (lines, where its body starts):"; echo "$long"; fail=1
fi
[ $fail = 0 ] && echo "rules ok"
exit $fail
