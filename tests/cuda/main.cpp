// SPDX-License-Identifier: Apache-2.0
// Entry point of the CUDA tests: exits with 77 (ctest's SKIP_RETURN_CODE) when cudaGetDeviceCount
// reports no device, so that GPU-less machines build the tests and report them skipped.
// Defining main here keeps the linker from taking the one in dg_test_support's Catch2 library.
#include <cstdio>

#include <cuda_runtime_api.h>

#if defined(DG_CATCH2_V3)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("dg_cuda_tests: no CUDA device (%s); skipping\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount reports 0 devices");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
