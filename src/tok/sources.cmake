# The tokenizer part (docs/tokenizer.md). Every source is listed by name, so
# a missing file stops the configure. The chat templates are src/template/.
list(APPEND EMBER_SOURCES
  src/tok/tok_util.c src/tok/tok_regex.c src/tok/tok_normalize.c src/tok/tok_pretok.c
  src/tok/tok_bpe.c src/tok/tok_wordpiece.c src/tok/tok_unigram.c src/tok/tok_added.c
  src/tok/tok_encode.c src/tok/tok_decode.c src/tok/tok_core.c src/tok/tok_json.c
  src/tok/tok_load.c src/tok/tok_gguf.c src/tok/tok_jfast.c)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
list(APPEND EMBER_EXTRA_LIBS PkgConfig::PCRE2 PkgConfig::UTF8PROC)
