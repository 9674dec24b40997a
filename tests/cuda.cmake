# The GPU tests (-DEMBER_CUDA=ON). Each exits 77 printing "skipped: no CUDA
# device" where there is no GPU (CI); on a GPU machine scripts/gpu-test.sh
# runs them, also under compute-sanitizer. `ctest -R cuda` selects them.
if(EMBER_CUDA)
  ember_test(test_cuda_ops test_cuda_ops.c)
  set_tests_properties(test_cuda_ops PROPERTIES LABELS cuda)
endif()
