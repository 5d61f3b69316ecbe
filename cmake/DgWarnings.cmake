# SPDX-License-Identifier: Apache-2.0
# Warning flags for this project's own targets (tests, examples, benchmarks): everything is an error.
set(DG_WARNINGS -Wall -Wextra -Wpedantic -Werror)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 reports (maybe-)uninitialized inside its own avx512fintrin.h when Eigen is compiled with
  # -march=native (a known false positive; the definite form appears under sanitizers).
  list(APPEND DG_WARNINGS -Wno-maybe-uninitialized)
  if(DG_SANITIZE)
    list(APPEND DG_WARNINGS -Wno-uninitialized)
  endif()
endif()

function(dg_target_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DG_WARNINGS}>)
  endif()
endfunction()
