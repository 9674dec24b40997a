# Instrument everything for libFuzzer (included by the top CMakeLists when EMBER_FUZZ=ON).
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "EMBER_FUZZ=ON needs clang: CC=clang cmake -S . -B build-fuzz -DEMBER_FUZZ=ON")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -gline-tables-only)
add_link_options(-fsanitize=address,undefined)
