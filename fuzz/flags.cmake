# Instrument everything for libFuzzer (included by the top CMakeLists when EMBER_FUZZ=ON).
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "EMBER_FUZZ=ON needs clang: CC=clang cmake -S . -B build-fuzz -DEMBER_FUZZ=ON")
endif()
# -fno-sanitize-recover: a UBSan report stops the run and leaves a crash file,
# like any other finding (by default UBSan prints and carries on).
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
                    -gline-tables-only)
add_link_options(-fsanitize=address,undefined)
