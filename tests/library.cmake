# libember as embedders see it: the text API (tests/test_text_api.c).
ember_test(test_text_api test_text_api.c)
