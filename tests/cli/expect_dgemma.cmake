# SPDX-License-Identifier: Apache-2.0
# Checks shared by the command-line tests: `dgemma ARGS...` must fail, with stderr matching a
# pattern. Include after DGEMMA is set.

# Any failure (exit code other than 0).
function(expect_failure pattern)
  execute_process(COMMAND ${DGEMMA} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "dgemma ${ARGN}: expected an error matching '${pattern}', got ${rc}:\n${out}\n${err}")
  endif()
endfunction()

# A usage error: exit code 2.
function(expect_usage_error pattern)
  execute_process(COMMAND ${DGEMMA} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "dgemma ${ARGN}: expected exit code 2 and an error matching '${pattern}', got ${rc}:\n${out}\n${err}")
  endif()
endfunction()
