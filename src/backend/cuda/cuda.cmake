# The CUDA backend (docs/cuda.md), included from the top CMakeLists.txt.
#
# It is included before the project-wide C warning flags (add_compile_options),
# which nvcc does not take: the object library made here carries its own
# flags, and its objects reach libember (static and shared) through
# EMBER_EXTRA_LIBS, which the libember targets link. Without EMBER_CUDA the
# library holds only cuda_stub.c, whose entry points answer
# EMBER_ERR_UNSUPPORTED.
# -Werror only with EMBER_WERROR (top CMakeLists.txt), like the rest of the tree.
set(EMBER_CUDA_C_FLAGS -Wall -Wextra ${EMBER_WERROR_FLAG} -ffp-contract=off -fno-strict-aliasing)
if(EMBER_CUDA)
  # sm_90 machine code plus compute_90 PTX that newer GPUs compile at load;
  # we pass the -gencode ourselves, so CMake adds no architecture flags.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  add_library(ember_cuda OBJECT
    src/backend/cuda/cuda_backend.c src/backend/cuda/cuda_matmul.cu src/backend/cuda/cuda_ops.cu
    src/backend/cuda/cuda_attn.cu src/backend/cuda/cuda_delta.cu src/backend/cuda/cuda_wgmma.cu
    src/backend/cuda/cuda_qmm.cu src/backend/cuda/cuda_sample.cu src/backend/cuda/cuda_mlx.cu)
  # --fmad=false: no multiply-add contraction (the C side builds with
  # -ffp-contract=off); the matmul kernels call fmaf explicitly.
  set(EMBER_CUDA_NVCC_FLAGS "-gencode=arch=compute_90,code=[sm_90,compute_90]" --fmad=false -lineinfo
      "-Xcompiler=-Wall,-Wextra")
  if(EMBER_WERROR)
    list(APPEND EMBER_CUDA_NVCC_FLAGS -Werror=all-warnings "-Xcompiler=-Werror")
  endif()
  set_source_files_properties(src/backend/cuda/cuda_matmul.cu src/backend/cuda/cuda_ops.cu src/backend/cuda/cuda_attn.cu
    src/backend/cuda/cuda_delta.cu src/backend/cuda/cuda_qmm.cu src/backend/cuda/cuda_sample.cu
    src/backend/cuda/cuda_mlx.cu PROPERTIES COMPILE_OPTIONS "${EMBER_CUDA_NVCC_FLAGS}")
  # cuda_wgmma.cu: Hopper's wgmma needs the sm_90a machine code (no PTX: it
  # would not run elsewhere); the launcher uses it on compute capability 9.0
  # alone and the kernels above everywhere else.
  string(REPLACE "-gencode=arch=compute_90,code=[sm_90,compute_90]" "-gencode=arch=compute_90a,code=sm_90a"
    EMBER_CUDA_WG_FLAGS "${EMBER_CUDA_NVCC_FLAGS}")
  set_source_files_properties(src/backend/cuda/cuda_wgmma.cu PROPERTIES COMPILE_OPTIONS "${EMBER_CUDA_WG_FLAGS}")
  set_source_files_properties(src/backend/cuda/cuda_backend.c PROPERTIES COMPILE_OPTIONS "${EMBER_CUDA_C_FLAGS}")
  # the CUDA headers are system headers: no warnings from them
  target_include_directories(ember_cuda SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(ember_cuda PUBLIC CUDA::cudart_static)
else()
  add_library(ember_cuda OBJECT src/backend/cuda/cuda_stub.c)
  target_compile_options(ember_cuda PRIVATE ${EMBER_CUDA_C_FLAGS})
endif()
target_include_directories(ember_cuda PRIVATE include src)
set_target_properties(ember_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON C_VISIBILITY_PRESET hidden
                                            CUDA_VISIBILITY_PRESET hidden)
list(APPEND EMBER_EXTRA_LIBS ember_cuda)
