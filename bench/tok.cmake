# Tokenizer encode throughput (bench/RESULTS.md, section "Tokenizer").
add_executable(tok_bench tok_bench.c)
target_link_libraries(tok_bench PRIVATE ember_static)
target_include_directories(tok_bench PRIVATE ${CMAKE_SOURCE_DIR}/src)
# Tokenizer load time (bench/RESULTS.md, section "Startup").
add_executable(tok_load_bench tok_load_bench.c)
target_link_libraries(tok_load_bench PRIVATE ember_static)
target_include_directories(tok_load_bench PRIVATE ${CMAKE_SOURCE_DIR}/src)
