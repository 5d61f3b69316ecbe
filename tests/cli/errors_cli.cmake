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
# A file's contents are not a usage error: exit code 1 from both, naming the file.
foreach(command "tokenize;--text-file" "generate;--prompt-file")
  list(GET command 0 name)
  list(GET command 1 flag)
  execute_process(COMMAND ${DGEMMA} ${name} --model ${MODEL} ${flag} ${WORK}/bad.txt RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "bad.txt: not valid UTF-8 \\(byte 10\\)")
    message(FATAL_ERROR "dgemma ${name} ${flag} with invalid UTF-8: expected exit code 1 naming the file, got ${rc}: ${err}")
  endif()
endforeach()
expect_failure("standard input: not valid UTF-8" tokenize --model ${MODEL} --text-file - INPUT_FILE ${WORK}/bad.txt)
expect_usage_error("--text is not valid UTF-8 \\(byte 10\\)" tokenize --model ${MODEL} --text "${text}${ff}")
# --system too (it went unchecked into the chat template's trim, which read past its end).
expect_usage_error("--system is not valid UTF-8" generate --model ${MODEL} --chat --system "rules${ff}" --prompt hi)
file(WRITE "${WORK}/one.jsonl" "\"hi\"\n")
expect_usage_error("--system is not valid UTF-8" batch --model ${MODEL} --chat --system "rules${ff}" --input ${WORK}/one.jsonl)

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
# A list flag that is missing is named as missing, not as an empty integer.
expect_usage_error("missing required flag --ids" detokenize --model ${MODEL})

# Without a command, the usage is an error: exit code 2, on stderr.
execute_process(COMMAND ${DGEMMA} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "dgemma <command> --help" OR NOT out STREQUAL "")
  message(FATAL_ERROR "dgemma without a command: expected the usage on stderr and exit code 2, got ${rc}:\n${out}\n${err}")
endif()

# A full disk (here a file-size limit) is reported, naming what could not be written: the trace was
# cut mid-line and the answer lost with exit code 0.
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 1; exec \"$0\" generate --model \"$1\" --prompt 'Sort ascending: 9 4 7' --threads 1 --max-new-tokens 48 --stability-threshold 100000 --json --trace \"$2\""
                        ${DGEMMA} ${MODEL} ${WORK}/cut_trace.jsonl
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "cut_trace.jsonl: write failed \\(File too large\\)")
  message(FATAL_ERROR "generate --trace past a file-size limit: expected exit 1 naming the trace, got ${rc}: ${err}")
endif()
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 0; exec \"$0\" generate --model \"$1\" --prompt hi --threads 1 --max-new-tokens 16 --json > \"$2\""
                        ${DGEMMA} ${MODEL} ${WORK}/cut_answer.json
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "standard output: write failed")
  message(FATAL_ERROR "generate --json past a file-size limit: expected exit 1, got ${rc}: ${err}")
endif()

# A file named by --output or --trace is left alone when a later flag is refused.
file(WRITE "${WORK}/prompts.jsonl" "{\"prompt\": \"Add: 1 + 2\", \"max_new_tokens\": 16}\n")
foreach(bad "precision;bogus" "memory-budget;abc" "threads;-1")
  list(GET bad 0 flag)
  list(GET bad 1 value)
  file(WRITE "${WORK}/results.jsonl" "precious\n")
  expect_usage_error("--${flag}" batch --model ${MODEL} --input ${WORK}/prompts.jsonl --output ${WORK}/results.jsonl --${flag} ${value})
  file(READ "${WORK}/results.jsonl" kept)
  if(NOT kept STREQUAL "precious\n")
    message(FATAL_ERROR "dgemma batch ${bad}: the refused run emptied --output")
  endif()
endforeach()
# --output may be the input: a line refused at submission leaves it as it was.
set(lines "\"Hello\"\n{\"prompt\": \"x\", \"max_new_tokens\": 1000}\n")
file(WRITE "${WORK}/in_place.jsonl" "${lines}")
expect_failure("in_place.jsonl:2: max_new_tokens 1000"
               batch --model ${MODEL} --input ${WORK}/in_place.jsonl --output ${WORK}/in_place.jsonl)
file(READ "${WORK}/in_place.jsonl" kept)
if(NOT kept STREQUAL lines)
  message(FATAL_ERROR "dgemma batch: a refused line emptied --output, which was the input")
endif()
expect_failure("is a directory" batch --model ${MODEL} --input ${WORK}/prompts.jsonl --output ${WORK})
# SIGTERM cancels generate as Ctrl-C does: what was committed is printed, the finish says
# "cancelled" and the exit code is 130 (it ended the program, and the answer was lost).
# --foreground: the signal goes to dgemma once (timeout sends it to the process group too).
execute_process(COMMAND timeout --foreground --preserve-status -s TERM 4 ${DGEMMA} generate --model ${MODEL} --prompt "Sort ascending: 9 4 7"
                        --threads 1 --max-new-tokens 256 --max-denoising-steps 1000000 --stability-threshold 100000 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 130 OR NOT out MATCHES "\"finish\":\"cancelled\"")
  message(FATAL_ERROR "dgemma generate on SIGTERM: expected exit 130 and a cancelled answer, got ${rc}:\n${out}\n${err}")
endif()
# An interrupted batch leaves --output alone when it is the input, and writes its results (a line
# per prompt, "cancelled" for those not run) beside it. The run was emptying it first.
set(long_lines "")
foreach(i RANGE 1 600)
  string(APPEND long_lines "{\"prompt\": \"Sort ascending: ${i} 9 4\", \"max_new_tokens\": 48}\n")
endforeach()
file(WRITE "${WORK}/interrupted.jsonl" "${long_lines}")
execute_process(COMMAND timeout --foreground -s INT 10 ${DGEMMA} batch --model ${MODEL} --input ${WORK}/interrupted.jsonl
                        --output ${WORK}/interrupted.jsonl --threads 1 --stability-threshold 100000
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ "${WORK}/interrupted.jsonl" kept)
if(NOT kept STREQUAL long_lines)
  message(FATAL_ERROR "dgemma batch interrupted: --output (the input) was changed (${rc}):\n${err}")
endif()
if(NOT err MATCHES "interrupted: [0-9]+ of 600 prompts cancelled; the results are in ([^\n ]*interrupted.jsonl.partial-[A-Za-z0-9]+) \\(--output is the input: left as it was\\)")
  message(FATAL_ERROR "dgemma batch interrupted: expected the partial results' file to be named, got ${rc}:\n${err}")
endif()
file(STRINGS "${CMAKE_MATCH_1}" partial)
list(LENGTH partial partial_lines)
list(GET partial -1 last)
if(NOT partial_lines EQUAL 600 OR NOT last MATCHES "\"index\":599,\"line\":600,\"error\":\"cancelled\"")
  message(FATAL_ERROR "dgemma batch interrupted: ${partial_lines} lines in ${CMAKE_MATCH_1}, the last '${last}'")
endif()
file(REMOVE "${CMAKE_MATCH_1}")
# Rewriting its own input on a full disk (a file-size limit) leaves the input as it was.
set(ten "")
foreach(i RANGE 1 10)
  string(APPEND ten "\"Add: ${i} + 1\"\n")
endforeach()
file(WRITE "${WORK}/full_in_place.jsonl" "${ten}")
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 1; exec \"$0\" batch --model \"$1\" --input \"$2\" --output \"$2\" --threads 1 --max-new-tokens 16"
                        ${DGEMMA} ${MODEL} ${WORK}/full_in_place.jsonl
                RESULT_VARIABLE rc ERROR_VARIABLE err)
file(READ "${WORK}/full_in_place.jsonl" kept)
if(NOT rc EQUAL 1 OR NOT err MATCHES "write failed \\(File too large\\); --output \\(the input\\) was left as it was" OR
   NOT kept STREQUAL ten)
  message(FATAL_ERROR "batch in place on a full disk: ${rc}: ${err}\nthe input now holds '${kept}'")
endif()
# --output is opened only at the end, as it is: /dev/stdout is standard output.
execute_process(COMMAND ${DGEMMA} batch --model ${MODEL} --input ${WORK}/prompts.jsonl --output /dev/stdout --threads 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^{\"index\":0,\"line\":1,\"text\"")
  message(FATAL_ERROR "dgemma batch --output /dev/stdout: ${rc}\n${out}\n${err}")
endif()
# A symbolic link stays a link; its target gets the results.
file(WRITE "${WORK}/target.jsonl" "old\n")
file(CREATE_LINK "${WORK}/target.jsonl" "${WORK}/link.jsonl" SYMBOLIC)
execute_process(COMMAND ${DGEMMA} batch --model ${MODEL} --input ${WORK}/prompts.jsonl --output ${WORK}/link.jsonl --threads 1
                RESULT_VARIABLE rc ERROR_VARIABLE err)
file(READ "${WORK}/target.jsonl" target)
if(NOT rc EQUAL 0 OR NOT IS_SYMLINK "${WORK}/link.jsonl" OR NOT target MATCHES "^{\"index\":0")
  message(FATAL_ERROR "dgemma batch --output LINK: ${rc} ${err}; the target holds '${target}'")
endif()
file(WRITE "${WORK}/trace.jsonl" "precious\n")
expect_usage_error("--view-delay" generate --model ${MODEL} --prompt hi --trace ${WORK}/trace.jsonl --view-delay x)
file(READ "${WORK}/trace.jsonl" kept)
if(NOT kept STREQUAL "precious\n")
  message(FATAL_ERROR "dgemma generate --view-delay x: the refused run emptied --trace")
endif()
# No output lands on a file of the checkpoint, whatever the path's spelling: model.safetensors is
# memory-mapped, and truncating it under the running model crashed dgemma (SIGBUS) and emptied it.
set(own "${WORK}/own_model")
file(COPY "${MODEL}/" DESTINATION "${own}")
file(SIZE "${own}/model.safetensors" size_before)
file(CREATE_LINK "${own}/config.json" "${WORK}/config_link.json" SYMBOLIC)
expect_failure("--trace ${own}/model.safetensors is the checkpoint's own .*model.safetensors: refusing"
               generate --model ${own} --prompt hi --max-new-tokens 16 --trace ${own}/model.safetensors)
expect_failure("--trace ${WORK}/config_link.json is the checkpoint's own .*config.json: refusing"
               generate --model ${own} --prompt hi --max-new-tokens 16 --trace ${WORK}/config_link.json)
expect_failure("--output ${own}/tokenizer.json is the checkpoint's own"
               batch --model ${own} --input ${WORK}/prompts.jsonl --output ${own}/tokenizer.json)
expect_failure("--out ${own}/model.safetensors is the checkpoint's own"
               parity --model ${own} --prompt-ids 2,3 --out ${own}/model.safetensors)
expect_failure("--out ${own}/model.safetensors is the checkpoint's own"
               dequantize --model ${own} --out ${own}/model.safetensors)
file(SIZE "${own}/model.safetensors" size_after)
file(READ "${MODEL}/config.json" config_expected)
file(READ "${own}/config.json" config_kept)
if(NOT size_after EQUAL size_before OR NOT config_kept STREQUAL config_expected)
  message(FATAL_ERROR "a refused output changed the checkpoint (model.safetensors ${size_before} -> ${size_after} bytes)")
endif()
# Inputs from a pipe: "-" (and /dev/stdin) read standard input, and give what the same file gives.
file(WRITE "${WORK}/pipe_prompt.txt" "Add: 7 + 5")
file(WRITE "${WORK}/pipe_batch.jsonl" "\"Sort: b a\"\n{\"prompt\": \"Add: 1 + 2\", \"seed\": 4}\n")
foreach(run "generate;--prompt-file;pipe_prompt.txt;--json;--max-new-tokens;16;--threads;1"
            "tokenize;--text-file;pipe_prompt.txt;--no-special"
            "batch;--input;pipe_batch.jsonl;--max-new-tokens;16;--threads;1")
  list(GET run 0 command)
  list(GET run 1 flag)
  list(GET run 2 name)
  list(SUBLIST run 3 -1 rest)
  execute_process(COMMAND ${DGEMMA} ${command} --model ${MODEL} ${flag} ${WORK}/${name} ${rest}
                  RESULT_VARIABLE rc1 OUTPUT_VARIABLE from_file ERROR_VARIABLE err1)
  string(REGEX REPLACE "\"seconds\":[-+.e0-9]+" "" from_file "${from_file}")  # timings differ between runs
  foreach(stdin_name "-" "/dev/stdin")
    execute_process(COMMAND ${DGEMMA} ${command} --model ${MODEL} ${flag} ${stdin_name} ${rest}
                    INPUT_FILE ${WORK}/${name} RESULT_VARIABLE rc2 OUTPUT_VARIABLE from_pipe ERROR_VARIABLE err2)
    string(REGEX REPLACE "\"seconds\":[-+.e0-9]+" "" from_pipe "${from_pipe}")
    if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0 OR from_file STREQUAL "" OR NOT from_pipe STREQUAL from_file)
      message(FATAL_ERROR "dgemma ${command} ${flag} ${stdin_name}: '${from_pipe}' (${rc2}: ${err2}) against the file's "
                          "'${from_file}' (${rc1}: ${err1})")
    endif()
  endforeach()
endforeach()
# batch's --output - is standard output, as no --output is (and no file named "-" appears).
execute_process(COMMAND ${DGEMMA} batch --model ${MODEL} --input - --output - --max-new-tokens 16 --threads 1
                INPUT_FILE ${WORK}/pipe_batch.jsonl WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX REPLACE "\"seconds\":[-+.e0-9]+" "" out "${out}")
if(NOT rc EQUAL 0 OR NOT out STREQUAL from_file OR EXISTS "${WORK}/-")
  message(FATAL_ERROR "dgemma batch --output -: '${out}' (${rc}: ${err}) against '${from_file}'")
endif()
expect_failure("standard input: .*no prompts" batch --model ${MODEL} --input - INPUT_FILE /dev/null)
# The text generate streams, canvas by canvas, is the text of its --json answer.
foreach(prompt "Add: 12 + 30" "Sort: c a b")
  set(common generate --model ${MODEL} --prompt "${prompt}" --max-new-tokens 48 --threads 1 --seed 3)
  execute_process(COMMAND ${DGEMMA} ${common} RESULT_VARIABLE rc1 OUTPUT_VARIABLE streamed ERROR_QUIET)
  execute_process(COMMAND ${DGEMMA} ${common} --json RESULT_VARIABLE rc2 OUTPUT_VARIABLE answer ERROR_QUIET)
  string(JSON text GET "${answer}" text)
  if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0 OR NOT streamed STREQUAL "${text}\n")
    message(FATAL_ERROR "dgemma generate '${prompt}': streamed '${streamed}' but --json says '${text}' (${rc1}, ${rc2})")
  endif()
endforeach()
message(STATUS "dgemma command-line errors: all checks passed")
