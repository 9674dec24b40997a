# The template part (../shared/DESIGN.md): the Jinja interpreter, chat
# rendering from the model's own template, and the tool-call formats
# (parsing calls out of generated text). Every source is listed by name, so
# a missing file stops the configure.
list(APPEND EMBER_SOURCES
  src/template/jinja_util.c src/template/jinja_lex.c src/template/jinja_parse.c src/template/jinja_value.c
  src/template/jinja_eval.c src/template/jinja_case.c src/template/chat.c src/template/input.c
  src/template/toolcall.c src/template/load.c)
