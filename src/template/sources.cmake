# The template part (../shared/DESIGN.md): the Jinja interpreter and chat
# rendering from the model's own template; the tool-call formats join it.
# Every source is listed by name, so a missing file stops the configure.
list(APPEND EMBER_SOURCES
  src/template/jinja_util.c src/template/jinja_lex.c src/template/jinja_parse.c src/template/jinja_value.c
  src/template/jinja_eval.c src/template/jinja_case.c src/template/chat.c)
