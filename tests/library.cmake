# libember as embedders see it: the text API (tests/test_text_api.c) and the
# example program built against an installed copy with pkg-config alone
# (tests/example_chat.sh: cmake --install into the build's tmp dir).
ember_test(test_text_api test_text_api.c)
if(EMBER_SANITIZE)
  set(EMBER_EXAMPLE_CFLAGS "-fsanitize=address,undefined")
else()
  set(EMBER_EXAMPLE_CFLAGS "")
endif()
add_test(NAME test_example_chat
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/example_chat.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}
                 $<TARGET_FILE:ember> ${CMAKE_C_COMPILER} "${EMBER_EXAMPLE_CFLAGS}")
set_tests_properties(test_example_chat PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
