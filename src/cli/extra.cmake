list(APPEND EMBER_CLI_SOURCES src/cli/cmd_tokenize.c)
