# tool-call formats: parsing calls out of generated text (src/template/toolcall.c)
list(APPEND EMBER_SOURCES src/template/toolcall.c)
