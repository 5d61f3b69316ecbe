# SPDX-License-Identifier: Apache-2.0
# cmake -DCXX=<compiler> -DINCLUDE=<include dir> -DSOURCE=<file.cpp> -DEXPECT=<text> -P expect_compile_error.cmake
# Compiles SOURCE (syntax only) and passes when compilation FAILS with EXPECT in the diagnostics:
# a misuse test, like Eigen's failtests.
execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only -I${INCLUDE} ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must be refused")
endif()
string(FIND "${out}${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${SOURCE} was refused without naming '${EXPECT}':\n${err}")
endif()
message(STATUS "refused as expected: ${EXPECT}")
