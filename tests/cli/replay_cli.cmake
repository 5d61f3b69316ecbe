# SPDX-License-Identifier: Apache-2.0
# `dgemma replay` must print exactly the tokens, steps and stop reasons transformers produced, and
# `dgemma generate` must reject bad flags by name with exit code 2.
#   cmake -DDGEMMA=<dgemma> -DFIXTURES=<tests/fixtures> -P replay_cli.cmake
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
