# SPDX-License-Identifier: Apache-2.0
# `dgemma quantize` end to end: the BF16 base fixture quantised with the scheme of a fixture that
# compressed-tensors (or, llmc_*, llm-compressor's model_free_ptq) wrote from the same weights must
# dequantise to exactly the same matrices (compared through `dgemma dequantize`), and bad flags are
# refused by name.
#   cmake -DDGEMMA=<dgemma> -DFIXTURES=<tests/fixtures> -DWORK=<dir> -P quantize_cli.cmake
cmake_policy(VERSION 3.21)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/expect_dgemma.cmake)

function(run)
  execute_process(COMMAND ${DGEMMA} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dgemma ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_err "${err}" PARENT_SCOPE)
endfunction()

# fixture -> dgemma quantize flags that reproduce it
set(cases "w4a16_asym_g64|--scheme,w4a16,--group-size,64,--asymmetric"
          "w8a16_channel|--scheme,w8a16"
          "int8_channel_split|--scheme,int8"
          "fp8_channel|--scheme,fp8,--shard-size,0.1"
          "llmc_w4a16|--scheme,w4a16,--group-size,32"
          "llmc_fp8_dynamic|--scheme,fp8")
foreach(c IN LISTS cases)
  string(REPLACE "|" ";" parts "${c}")
  string(REPLACE "," ";" parts "${parts}")
  list(GET parts 0 fixture)
  list(SUBLIST parts 1 -1 flags)
  set(out "${WORK}/${fixture}")
  run(quantize --model ${FIXTURES}/quant/base --out ${out} ${flags})
  # Progress every 5 %, and "100%" once, after the last tensor (it was printed twice).
  string(REGEX MATCHALL "quantize: 100%" hundred "${last_err}")
  list(LENGTH hundred n_hundred)
  if(NOT n_hundred EQUAL 1 OR NOT last_err MATCHES "quantize: +5%")
    message(FATAL_ERROR "dgemma quantize progress: ${n_hundred} lines of 100%:\n${last_err}")
  endif()
  foreach(f config.json generation_config.json model.safetensors.index.json)
    if(NOT EXISTS "${out}/${f}")
      message(FATAL_ERROR "dgemma quantize wrote no ${f}")
    endif()
  endforeach()
  run(dequantize --model ${out} --out ${out}.ours.safetensors)
  if(fixture STREQUAL "int8_channel_split")
    continue()  # the fixture keeps its experts fused in BF16; ours splits and quantises them
  endif()
  run(dequantize --model ${FIXTURES}/quant/${fixture} --out ${out}.theirs.safetensors)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${out}.ours.safetensors ${out}.theirs.safetensors
                  RESULT_VARIABLE same)
  if(NOT same EQUAL 0)
    message(FATAL_ERROR "dgemma quantize ${flags} does not reproduce ${fixture} (written by compressed-tensors / llm-compressor)")
  endif()
endforeach()
# fp8 with a 0.1 MiB shard limit must have been split into several shards.
file(GLOB shards "${WORK}/fp8_channel/model-*-of-*.safetensors")
list(LENGTH shards n)
if(n LESS 2)
  message(FATAL_ERROR "--shard-size 0.1 wrote ${n} shard(s)")
endif()

expect_failure("--scheme" quantize --model ${FIXTURES}/quant/base --out ${WORK}/x --scheme int3)
expect_failure("--group-size" quantize --model ${FIXTURES}/quant/base --out ${WORK}/x --scheme w4a16 --group-size 48)
expect_failure("--asymmetric" quantize --model ${FIXTURES}/quant/base --out ${WORK}/x --scheme fp8 --asymmetric)
expect_failure("already quantized" quantize --model ${FIXTURES}/quant/w8a16_channel --out ${WORK}/x --scheme w4a16)
expect_failure("already holds a checkpoint" quantize --model ${FIXTURES}/quant/base --out ${WORK}/fp8_channel --scheme fp8)
# A directory that holds anything is refused before a file in it is touched: quantize would
# otherwise overwrite a README.md or tokenizer.json of the user's, or leave old shards beside the
# new ones. So is an output path that is a file.
file(MAKE_DIRECTORY "${WORK}/not_empty")
file(WRITE "${WORK}/not_empty/README.md" "mine\n")
expect_failure("is not empty \\(it holds 'README.md'\\)" quantize --model ${FIXTURES}/quant/base --out ${WORK}/not_empty --scheme fp8)
file(READ "${WORK}/not_empty/README.md" kept)
file(GLOB written "${WORK}/not_empty/*")
list(LENGTH written n_written)
if(NOT kept STREQUAL "mine\n" OR NOT n_written EQUAL 1)
  message(FATAL_ERROR "dgemma quantize wrote into a directory it refused: ${written}")
endif()
file(WRITE "${WORK}/a_file" "x")
expect_failure("not a directory" quantize --model ${FIXTURES}/quant/base --out ${WORK}/a_file --scheme fp8)
# An existing empty directory is fine.
file(MAKE_DIRECTORY "${WORK}/empty")
run(quantize --model ${FIXTURES}/quant/base --out ${WORK}/empty --scheme fp8)
# Every file of the source folder is copied, an empty one too (it used to fail the run at its end).
file(COPY "${FIXTURES}/quant/base/" DESTINATION "${WORK}/with_empty_file")
file(WRITE "${WORK}/with_empty_file/empty_notes.txt" "")
run(quantize --model ${WORK}/with_empty_file --out ${WORK}/from_empty_file --scheme fp8)
if(NOT EXISTS "${WORK}/from_empty_file/empty_notes.txt")
  message(FATAL_ERROR "dgemma quantize did not copy an empty file")
endif()
# A checkpoint that does not match its config.json (here: a third layer the weights lack) is refused
# before anything is written, naming the missing tensors; it used to be quantised, exit 0, into a
# checkpoint that then failed to load.
file(COPY "${FIXTURES}/quant/base/" DESTINATION "${WORK}/three_layers")
file(READ "${WORK}/three_layers/config.json" cfg)
string(JSON cfg SET "${cfg}" text_config num_hidden_layers 3)
string(JSON cfg SET "${cfg}" text_config layer_types "[\"sliding_attention\", \"full_attention\", \"full_attention\"]")
string(JSON cfg SET "${cfg}" text_config per_layer_config 2 "{\"head_dim\": 64}")
file(WRITE "${WORK}/three_layers/config.json" "${cfg}")
expect_failure("missing tensors.*layers\\.2\\." quantize --model ${WORK}/three_layers --out ${WORK}/from_three_layers --scheme w4a16)
if(EXISTS "${WORK}/from_three_layers")
  message(FATAL_ERROR "dgemma quantize created its output for a checkpoint it refused")
endif()
# A dequantize cut short by a full disk (here a file-size limit) says why and leaves no cut file.
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 16; exec \"$0\" dequantize --model \"$1\" --out \"$2\""
                        ${DGEMMA} ${FIXTURES}/quant/w4a16_g32 ${WORK}/cut.safetensors
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "cut.safetensors: write failed \\(File too large\\); nothing was kept" OR
   EXISTS "${WORK}/cut.safetensors")
  message(FATAL_ERROR "dequantize past a file-size limit: expected exit 1 naming the file and no file left, got ${rc}: ${err}")
endif()
# Through a symbolic link the cut file is named, and neither the link nor its target is removed.
file(WRITE "${WORK}/cut_target.safetensors" "old")
file(CREATE_LINK "${WORK}/cut_target.safetensors" "${WORK}/cut_link.safetensors" SYMBOLIC)
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 16; exec \"$0\" dequantize --model \"$1\" --out \"$2\""
                        ${DGEMMA} ${FIXTURES}/quant/w4a16_g32 ${WORK}/cut_link.safetensors
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "cut_link.safetensors: write failed \\(File too large\\); what it holds is cut" OR
   NOT IS_SYMLINK "${WORK}/cut_link.safetensors" OR NOT EXISTS "${WORK}/cut_target.safetensors")
  message(FATAL_ERROR "dequantize through a link past a file-size limit: ${rc}: ${err}")
endif()
# dequantize on a checkpoint that is not quantized says so instead of writing an empty file.
expect_failure("not quantized" dequantize --model ${FIXTURES}/quant/base --out ${WORK}/nothing.safetensors)
if(EXISTS "${WORK}/nothing.safetensors")
  message(FATAL_ERROR "dgemma dequantize wrote a file for a checkpoint that is not quantized")
endif()
message(STATUS "dgemma quantize: all checks passed")
