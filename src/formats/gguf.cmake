# The GGUF reader and the reference quantized block formats.
list(APPEND EMBER_SOURCES src/formats/gguf.c src/formats/quant.c)
