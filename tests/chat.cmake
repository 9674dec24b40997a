# Chat templates (src/template/: jinja*.c, chat.c).
# test_chat_templates compares the template corpus with the reference outputs
# in tests/data/chat (regenerate with tests/ref/render_templates.mjs).
ember_test(test_chat_templates test_chat_templates.c)
target_compile_definitions(test_chat_templates PRIVATE EMBER_CHAT_DATA="${CMAKE_CURRENT_SOURCE_DIR}/data/chat")
# Error positions, limits and the API of src/template/jinja.h and chat.h.
ember_test(test_jinja test_jinja.c)
# Tool-call parsers of every format (src/template/toolcall.c).
ember_test(test_toolcall test_toolcall.c)
