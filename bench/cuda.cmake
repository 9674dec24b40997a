# The CUDA benchmark (-DEMBER_CUDA=ON): copy bandwidth and the matmul rates
# of the CUDA backend; scripts/gpu-test.sh runs it on the GPU machine.
if(EMBER_CUDA)
  add_executable(cuda_ops_bench cuda_ops_bench.c)
  target_include_directories(cuda_ops_bench PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_include_directories(cuda_ops_bench SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(cuda_ops_bench PRIVATE ember_static CUDA::cudart_static)
endif()
# cublas_ref: the cuBLAS bf16 GEMM rate on the models' shapes, the reference of
# issue 15's prefill goal. Measuring only, built only where the toolkit has
# cuBLAS; nothing of ember links cuBLAS.
if(EMBER_CUDA AND TARGET CUDA::cublas)
  add_executable(cublas_ref cublas_ref.c)
  target_include_directories(cublas_ref SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(cublas_ref PRIVATE CUDA::cublas CUDA::cudart)
endif()
