# Tokenizer tests (src/tok). Data: tests/data/tok (committed,
# written by tests/ref/tok/tokenize_corpus.mjs) and ../shared/testdata.
ember_test(test_tok_corpus test_tok_corpus.c)
target_compile_definitions(test_tok_corpus PRIVATE EMBER_TOK_DATA="${CMAKE_SOURCE_DIR}/tests/data/tok")
ember_test(test_tok_vocab test_tok_vocab.c)
ember_test(test_tok_variants test_tok_variants.c)
target_compile_definitions(test_tok_variants PRIVATE EMBER_TOK_DATA="${CMAKE_SOURCE_DIR}/tests/data/tok")
ember_test(test_tok_unit test_tok_unit.c)
ember_test(test_tok_cli test_tok_cli.c)
add_dependencies(test_tok_cli ember)
