# SPDX-License-Identifier: Apache-2.0
# `dgemma replay` must print exactly the tokens, steps and stop reasons transformers produced, and
# `dgemma generate` must reject bad flags by name with exit code 2.
#   cmake -DDGEMMA=<dgemma> -DFIXTURES=<tests/fixtures> -P replay_cli.cmake
cmake_policy(VERSION 3.21)
function(check_run ckpt run)
  file(READ "${FIXTURES}/${ckpt}/replay/${run}.json" expected)
  string(JSON s GET "${expected}" settings)
  string(JSON mnt GET "${s}" max_new_tokens)
  string(JSON steps GET "${s}" max_denoising_steps)
  string(JSON tmin GET "${s}" t_min)
  string(JSON tmax GET "${s}" t_max)
  string(JSON stab GET "${s}" stability_threshold)
  string(JSON conf GET "${s}" confidence_threshold)
  string(JSON bound GET "${s}" sampler_config entropy_bound)
  string(JSON neos LENGTH "${s}" eos_token_id)
  set(eos "")
  math(EXPR last "${neos} - 1")
  foreach(i RANGE ${last})
    string(JSON id GET "${s}" eos_token_id ${i})
    list(APPEND eos ${id})
  endforeach()
  list(JOIN eos "," eos)
  execute_process(COMMAND ${DGEMMA} replay --model ${FIXTURES}/${ckpt} --draws ${FIXTURES}/${ckpt}/replay/${run}.draws.safetensors
                          --max-new-tokens ${mnt} --max-denoising-steps ${steps} --t-min ${tmin} --t-max ${tmax}
                          --stability-threshold ${stab} --confidence-threshold ${conf} --entropy-bound ${bound}
                          --stop-ids ${eos}
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dgemma replay ${ckpt}/${run} failed (${rc})")
  endif()
  foreach(key tokens steps stop)
    string(JSON want GET "${expected}" ${key})
    string(JSON got GET "${out}" ${key})
    string(JSON equal EQUAL "${want}" "${got}")
    if(NOT equal)
      message(FATAL_ERROR "${ckpt}/${run}: ${key} differ\n  transformers: ${want}\n  dgemma:       ${got}")
    endif()
  endforeach()
endfunction()

check_run(dg_wide stop_id)
check_run(dg_small_confident converge)

execute_process(COMMAND ${DGEMMA} generate --model ${FIXTURES}/dg_small --prompt-ids 1,2 --bogus 3
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "unknown flag --bogus")
  message(FATAL_ERROR "unknown flag: exit ${rc}, '${err}'")
endif()
execute_process(COMMAND ${DGEMMA} generate --model ${FIXTURES}/dg_small --prompt-ids 1,999
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--prompt-ids: 999 is out of range")
  message(FATAL_ERROR "out-of-range id: exit ${rc}, '${err}'")
endif()
execute_process(COMMAND ${DGEMMA} generate --model ${FIXTURES}/dg_small --prompt-ids 1 --max-new-tokens 300
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 1 OR NOT err MATCHES "beyond max_position_embeddings 256")
  message(FATAL_ERROR "too long: exit ${rc}, '${err}'")
endif()
message(STATUS "dgemma replay and flag checks passed")

# End to end with a tokenizer: a fixture checkpoint plus a test tokenizer of the same vocabulary.
set(model ${CMAKE_CURRENT_BINARY_DIR}/dg_wide_with_tokenizer)
file(REMOVE_RECURSE ${model})
file(COPY ${FIXTURES}/dg_wide/config.json ${FIXTURES}/dg_wide/generation_config.json ${FIXTURES}/dg_wide/model.safetensors
     DESTINATION ${model})
file(COPY_FILE ${FIXTURES}/tokenizers/gemma_bpe_300_unk.json ${model}/tokenizer.json)
execute_process(COMMAND ${DGEMMA} generate --model ${model} --chat --prompt "Hello there" --max-new-tokens 24
                        --max-denoising-steps 4 --seed 1 --json --trace ${CMAKE_CURRENT_BINARY_DIR}/trace.jsonl
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dgemma generate with a tokenizer failed (${rc})")
endif()
string(JSON text GET "${out}" text)
string(JSON ntok LENGTH "${out}" tokens)
string(JSON steps GET "${out}" steps 0)
if(ntok LESS 1 OR NOT steps EQUAL 4)
  message(FATAL_ERROR "unexpected generate output: ${out}")
endif()
file(STRINGS ${CMAKE_CURRENT_BINARY_DIR}/trace.jsonl trace)
list(LENGTH trace lines)
if(lines LESS 5)
  message(FATAL_ERROR "trace has ${lines} lines")
endif()
execute_process(COMMAND ${DGEMMA} tokenize --model ${model} --text "Hello there" OUTPUT_VARIABLE ids RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT ids MATCHES "^\\[2,")
  message(FATAL_ERROR "dgemma tokenize: '${ids}'")
endif()
string(ASCII 255 254 invalid_utf8)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/bad.txt "ok ${invalid_utf8} bad")
execute_process(COMMAND ${DGEMMA} generate --model ${model} --prompt-file ${CMAKE_CURRENT_BINARY_DIR}/bad.txt
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 1 OR NOT err MATCHES "not valid UTF-8")
  message(FATAL_ERROR "non-UTF-8 prompt file: exit ${rc}, '${err}'")
endif()
message(STATUS "dgemma generate/tokenize end to end passed: '${text}'")
