# SPDX-License-Identifier: Apache-2.0
# dgemma's command line on the bundled model: what a user mistypes is refused with exit code 2 and
# an error that names the flag, and values inside a flag's stated range are taken.
#   cmake -DDGEMMA=<dgemma> -DMODEL=<models/dg-tiny-tasks> -DWORK=<dir> -P errors_cli.cmake
cmake_policy(VERSION 3.21)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/expect_dgemma.cmake)

# Invalid UTF-8 is refused by tokenize as by generate (it encoded U+FFFD for the bad bytes).
file(WRITE "${WORK}/bad.txt" "Add: 1 + 2")
file(READ "${WORK}/bad.txt" text)
string(ASCII 255 ff)
file(WRITE "${WORK}/bad.txt" "${text}${ff}")
expect_usage_error("bad.txt is not valid UTF-8 \\(byte 10\\)" tokenize --model ${MODEL} --text-file ${WORK}/bad.txt)
expect_failure("not valid UTF-8" generate --model ${MODEL} --prompt-file ${WORK}/bad.txt)

# --seed takes all 64 bits, as the server's "seed" does; past them it is refused by name.
execute_process(COMMAND ${DGEMMA} generate --model ${MODEL} --prompt "Add: 1 + 2" --seed 18446744073709551615
                        --max-new-tokens 16 --json --threads 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\"text\"")
  message(FATAL_ERROR "dgemma generate --seed 18446744073709551615 failed (${rc}):\n${out}\n${err}")
endif()
expect_usage_error("--seed: 18446744073709551616 is out of range \\[0, 18446744073709551615\\]"
                   generate --model ${MODEL} --prompt hi --seed 18446744073709551616)
expect_usage_error("--seed: '1e3' is not an integer" generate --model ${MODEL} --prompt hi --seed 1e3)
expect_usage_error("--threads: -1 is out of range \\[0, 1024\\]" generate --model ${MODEL} --prompt hi --threads -1)
expect_usage_error("--max-new-tokens needs a value" generate --model ${MODEL} --prompt hi --max-new-tokens)
message(STATUS "dgemma command-line errors: all checks passed")
