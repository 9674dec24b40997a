# The CUDA benchmark (-DEMBER_CUDA=ON): copy bandwidth and the matmul rates
# of the CUDA backend; scripts/gpu-test.sh runs it on the GPU machine.
if(EMBER_CUDA)
  add_executable(cuda_ops_bench cuda_ops_bench.c)
  target_include_directories(cuda_ops_bench PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_include_directories(cuda_ops_bench SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(cuda_ops_bench PRIVATE ember_static CUDA::cudart_static)
endif()
