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
# A recording that went further than the replay (here: fewer steps allowed than it ran) is refused
# by name instead of printing tokens that match nothing.
execute_process(COMMAND ${DGEMMA} replay --model ${FIXTURES}/dg_small --draws ${FIXTURES}/dg_small/replay/default_short.draws.safetensors
                        --max-new-tokens 16 --max-denoising-steps 3
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "default_short.draws.safetensors: [0-9]+ recorded tensors? not used by this replay")
  message(FATAL_ERROR "dgemma replay with fewer steps than recorded: exit ${rc}, '${out}' '${err}'")
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

# dgemma batch: JSON Lines in, one result per line in input order, each equal to `dgemma generate`
# with the same prompt, seed and flags (here two at a time in the batch, ragged prompts).
set(batch_in ${CMAKE_CURRENT_BINARY_DIR}/batch.jsonl)
file(WRITE ${batch_in} "\"Hello there\"\n{\"prompt\": \"General Kenobi\", \"seed\": 5}\n\n"
                       "{\"prompt_ids\": [2, 7, 9], \"max_new_tokens\": 16}\n")
set(common --max-new-tokens 24 --max-denoising-steps 4)
set(common_16 --max-new-tokens 16 --max-denoising-steps 4)
execute_process(COMMAND ${DGEMMA} batch --model ${model} --input ${batch_in} --max-batch 2 ${common}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT err MATCHES "3 prompts")
  message(FATAL_ERROR "dgemma batch: exit ${rc}, '${err}'")
endif()
# Split by hand: a generated text may hold ';', which a CMake list would split on.
set(rest "${out}")
set(n 0)
while(NOT rest STREQUAL "")
  string(FIND "${rest}" "\n" eol)
  if(eol EQUAL -1)
    message(FATAL_ERROR "dgemma batch: the output does not end in a newline: '${out}'")
  endif()
  string(SUBSTRING "${rest}" 0 ${eol} line_${n})
  math(EXPR start "${eol} + 1")
  string(SUBSTRING "${rest}" ${start} -1 rest)
  math(EXPR n "${n} + 1")
endwhile()
if(NOT n EQUAL 3)
  message(FATAL_ERROR "dgemma batch wrote ${n} lines: '${out}'")
endif()
set(alone_0 ${common} --prompt "Hello there")
set(alone_1 ${common} --prompt "General Kenobi" --seed 5)
set(alone_2 ${common_16} --prompt-ids 2,7,9)
# "line" is the input line, 1-based as in error messages: the blank line 3 is counted.
set(line_of_0 1)
set(line_of_1 2)
set(line_of_2 4)
foreach(i 0 1 2)
  execute_process(COMMAND ${DGEMMA} generate --model ${model} ${alone_${i}} --json OUTPUT_VARIABLE ref
                  RESULT_VARIABLE rc)
  set(got "${line_${i}}")
  string(JSON got_index GET "${got}" index)
  string(JSON got_line GET "${got}" line)
  string(JSON got_tokens GET "${got}" tokens)
  string(JSON ref_tokens GET "${ref}" tokens)
  string(JSON got_text GET "${got}" text)
  string(JSON ref_text GET "${ref}" text)
  if(NOT rc EQUAL 0 OR NOT got_index EQUAL i OR NOT got_line EQUAL line_of_${i} OR NOT got_tokens STREQUAL ref_tokens
     OR NOT got_text STREQUAL ref_text)
    message(FATAL_ERROR "dgemma batch line ${i}: '${got}' but generate alone: '${ref}'")
  endif()
endforeach()
# A bad line is named with its file and line number before anything runs.
file(WRITE ${batch_in} "\"Hello\"\n{\"prompt\": \"x\", \"temperature\": 1}\n")
execute_process(COMMAND ${DGEMMA} batch --model ${model} --input ${batch_in} ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "batch.jsonl:2: unknown field \"temperature\"")
  message(FATAL_ERROR "dgemma batch with a bad line: exit ${rc}, '${err}'")
endif()
# --output is checked before any work: a path that cannot be written fails at once, named, before
# even line 2 (which can never run: 1000 new tokens exceed max_position_embeddings) is submitted.
file(WRITE ${batch_in} "\"Hello\"\n{\"prompt\": \"x\", \"max_new_tokens\": 1000}\n")
execute_process(COMMAND ${DGEMMA} batch --model ${model} --input ${batch_in}
                        --output ${CMAKE_CURRENT_BINARY_DIR}/no_such_dir/results.jsonl
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "no_such_dir/results.jsonl: cannot be written" OR err MATCHES "prompts|batch.jsonl:2"
   OR NOT out STREQUAL "")
  message(FATAL_ERROR "dgemma batch with an unwritable --output: exit ${rc}, '${out}' '${err}'")
endif()
# A dangling link is written through, so the directory it points into is checked (it was the
# link's own one, and the run failed only after the last prompt).
set(dangling ${CMAKE_CURRENT_BINARY_DIR}/dangling.jsonl)
file(REMOVE ${dangling})
file(CREATE_LINK ${CMAKE_CURRENT_BINARY_DIR}/no_such_dir/results.jsonl ${dangling} SYMBOLIC)
execute_process(COMMAND ${DGEMMA} batch --model ${model} --input ${batch_in} --output ${dangling}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "dangling.jsonl: cannot be written \\(.*no_such_dir \\(where the link points\\): No such file"
   OR err MATCHES "prompts|batch.jsonl:2")
  message(FATAL_ERROR "dgemma batch with --output a dangling link: exit ${rc}, '${out}' '${err}'")
endif()
message(STATUS "dgemma batch passed")

# `dgemma info` works from config.json alone, prints the kernels this CPU runs and the memory a
# generation needs, and --precision is checked by name.
set(config_only ${CMAKE_CURRENT_BINARY_DIR}/config_only)
file(REMOVE_RECURSE ${config_only})
file(MAKE_DIRECTORY ${config_only})
file(COPY_FILE ${FIXTURES}/dg_small/config.json ${config_only}/config.json)
execute_process(COMMAND ${DGEMMA} info --model ${config_only} --prompt-tokens 100 --max-new-tokens 16 --json
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dgemma info on a config-only directory failed (${rc})")
endif()
string(JSON present GET "${out}" weights_present)
string(JSON isa GET "${out}" cpu_isa)
string(JSON memory GET "${out}" generation_memory_bytes)
string(JSON weights GET "${out}" weight_bytes)
string(JSON kv GET "${out}" generation_kv_cache_bytes)
if(present OR isa STREQUAL "" OR NOT memory GREATER weights OR NOT kv GREATER 0)
  message(FATAL_ERROR "unexpected dgemma info output: ${out}")
endif()
# DG_CPU_INT8_TILES=1 is reported as ignored exactly when the kernel path does not name AMX-INT8.
execute_process(COMMAND ${CMAKE_COMMAND} -E env DG_CPU_INT8_TILES=1 ${DGEMMA} info --model ${config_only} --json
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
string(JSON tiles_ignored GET "${out}" cpu_int8_tiles_ignored)
string(JSON kernels GET "${out}" cpu_kernels)
string(FIND "${kernels}" "AMX-INT8" amx_int8_at)
if(NOT rc EQUAL 0 OR (tiles_ignored AND NOT amx_int8_at EQUAL -1) OR (NOT tiles_ignored AND amx_int8_at EQUAL -1))
  message(FATAL_ERROR "dgemma info with DG_CPU_INT8_TILES=1: ignored=${tiles_ignored}, kernels '${kernels}'")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env DG_CPU_INT8_TILES=0 ${DGEMMA} info --model ${config_only} --json
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
string(JSON tiles_ignored GET "${out}" cpu_int8_tiles_ignored)
if(NOT rc EQUAL 0 OR tiles_ignored)
  message(FATAL_ERROR "dgemma info with DG_CPU_INT8_TILES=0 reports the tiles as ignored: ${out}")
endif()
execute_process(COMMAND ${DGEMMA} info --model ${FIXTURES}/dg_small OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "cpu kernels +[a-z0-9]+, (fast|exact)" OR NOT out MATCHES "used in place")
  message(FATAL_ERROR "dgemma info: '${out}'")
endif()
# The KV cache holds the prompt and every canvas but the last (never encoded): 100 + 16 - 8.
execute_process(COMMAND ${DGEMMA} info --model ${config_only} --prompt-tokens 100 --max-new-tokens 16 --json
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
string(JSON positions GET "${out}" generation_cache_positions)
if(NOT positions EQUAL 108)
  message(FATAL_ERROR "dgemma info: a 100-token prompt + 16 new tokens in canvases of 8 cache 108 positions, not ${positions}")
endif()
# generation_config.json's max_length replaces a max_new_tokens left at its default: 20 - 4 = 16 new
# tokens, 2 canvases, 4 + 8 positions cached.
file(WRITE ${config_only}/generation_config.json "{\"max_length\": 20}")
execute_process(COMMAND ${DGEMMA} info --model ${config_only} --prompt-tokens 4 --json OUTPUT_VARIABLE out RESULT_VARIABLE rc)
string(JSON new_tokens GET "${out}" generation_new_tokens)
string(JSON positions GET "${out}" generation_cache_positions)
if(NOT rc EQUAL 0 OR NOT new_tokens EQUAL 16 OR NOT positions EQUAL 12)
  message(FATAL_ERROR "dgemma info with max_length 20: ${new_tokens} new tokens, ${positions} positions (16, 12 expected)")
endif()
file(REMOVE ${config_only}/generation_config.json)
# Head dims are named by layer type, whatever the order of the layers.
file(READ ${FIXTURES}/dg_small/config.json config)
string(JSON config SET "${config}" text_config layer_types "[\"full_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"]")
string(JSON full_shape GET "${config}" text_config per_layer_config 1)
string(JSON config SET "${config}" text_config per_layer_config "{\"0\": ${full_shape}, \"3\": ${full_shape}}")
file(WRITE ${config_only}/config.json "${config}")
execute_process(COMMAND ${DGEMMA} info --model ${config_only} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "head dim 12 / 24 \\(sliding / full\\)")
  message(FATAL_ERROR "dgemma info with a full first layer: exit ${rc}, '${out}' '${err}'")
endif()
# What the engine refuses is not estimated.
file(READ ${FIXTURES}/dg_small/config.json config)
string(JSON config SET "${config}" text_config top_k_experts 65)
string(JSON config SET "${config}" text_config num_experts 70)
file(WRITE ${config_only}/config.json "${config}")
execute_process(COMMAND ${DGEMMA} info --model ${config_only} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "top_k_experts 65 exceeds 64")
  message(FATAL_ERROR "dgemma info with top_k_experts 65: exit ${rc}, '${out}' '${err}'")
endif()
file(COPY_FILE ${FIXTURES}/dg_small/config.json ${config_only}/config.json)
# A dense checkpoint is checked against the dense backbone's engine, not refused as "not MoE".
execute_process(COMMAND ${DGEMMA} info --model ${FIXTURES}/gemma4_dense OUTPUT_VARIABLE out ERROR_VARIABLE err
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "KV cache")
  message(FATAL_ERROR "dgemma info on the dense fixture: exit ${rc}, '${out}' '${err}'")
endif()
# The estimate's defaults fit max_position_embeddings (256 here, with generation_config.json's 256
# new tokens): a generation that could not run is not estimated, and asking for one is refused.
execute_process(COMMAND ${DGEMMA} info --model ${FIXTURES}/dg_small --json OUTPUT_VARIABLE out RESULT_VARIABLE rc)
string(JSON prompt_tokens GET "${out}" generation_prompt_tokens)
string(JSON new_tokens GET "${out}" generation_new_tokens)
math(EXPR positions "${prompt_tokens} + ${new_tokens}")
if(NOT rc EQUAL 0 OR prompt_tokens LESS 1 OR new_tokens LESS 1 OR positions GREATER 256)
  message(FATAL_ERROR "dgemma info's default estimate does not fit max_position_embeddings 256: ${out}")
endif()
execute_process(COMMAND ${DGEMMA} info --model ${FIXTURES}/dg_small --prompt-tokens 200 --max-new-tokens 64
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "exceed max_position_embeddings 256")
  message(FATAL_ERROR "dgemma info with 200 + 64 positions of 256: exit ${rc}, '${out}' '${err}'")
endif()
# Weights that do not match config.json: the summary is printed, the error named, and the exit is 1.
set(mismatched ${CMAKE_CURRENT_BINARY_DIR}/mismatched)
file(REMOVE_RECURSE ${mismatched})
file(MAKE_DIRECTORY ${mismatched})
file(COPY_FILE ${FIXTURES}/dg_wide/config.json ${mismatched}/config.json)
file(CREATE_LINK ${FIXTURES}/dg_small/model.safetensors ${mismatched}/model.safetensors SYMBOLIC)
foreach(json "" "--json")
  execute_process(COMMAND ${DGEMMA} info --model ${mismatched} ${json} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 1 OR NOT out MATCHES "weights error|bind_error\": \"[^\"]" OR NOT out MATCHES "model.safetensors|shape")
    message(FATAL_ERROR "dgemma info ${json} on mismatched weights: exit ${rc}, '${out}' '${err}'")
  endif()
endforeach()
execute_process(COMMAND ${DGEMMA} generate --model ${FIXTURES}/dg_small --prompt-ids 2,5 --precision medium
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--precision must be exact or fast")
  message(FATAL_ERROR "bad --precision: exit ${rc}, '${err}'")
endif()
message(STATUS "dgemma info and engine flags passed (${isa})")
