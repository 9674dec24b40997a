# The GPU tests (-DEMBER_CUDA=ON). Each exits 77 printing "skipped: no CUDA
# device" where there is no GPU (CI); on a GPU machine scripts/gpu-test.sh
# runs them, also under compute-sanitizer. `ctest -R cuda` selects them.
if(EMBER_CUDA)
  ember_test(test_cuda_ops test_cuda_ops.c)
  set_tests_properties(test_cuda_ops PROPERTIES LABELS cuda)
  # the fixture models on the GPU: parity, batch and chunk invariance
  ember_test(test_cuda_model test_cuda_model.c)
  set_tests_properties(test_cuda_model PROPERTIES LABELS cuda)
endif()
