# Tests of the GGUF reader and the quantized block formats (both match
# `ctest -R gguf`).
ember_test(test_gguf test_gguf.c)
ember_test(test_gguf_quant test_quant.c)
