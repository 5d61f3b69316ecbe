# SPDX-License-Identifier: Apache-2.0
# Documentation citations must point into this repository. For every tracked text file under
# include/, examples/, benchmarks/, tests/, tools/, docs/, scripts/, README.md and models/*/README.md:
#   (a) a cited docs/<name>.md (also ../docs/<name>.md, and inside docs/ a bare <name>.md link
#       target) must exist;
#   (b) a cited section, "docs/<name>.md §3.5" (also "§2-§6", "§3.5, §3.6", "section 9", and a bare
#       "<name>.md §3" inside docs/), must have a numbered heading there ("## 3." / "### 3.5");
#   (c) nothing may cite the design and spec files that live outside the repository, nor the path
#       to the folder that holds them.
# The file list comes from `git ls-files`, so untracked build output is never read.
#   cmake -DROOT=<repo> -P doc_links.cmake
cmake_policy(VERSION 3.21)
if(NOT DEFINED ROOT OR NOT IS_DIRECTORY "${ROOT}")
  message(FATAL_ERROR "doc_links.cmake: pass -DROOT=<repository root>")
endif()

# Names are assembled here so that this file does not cite what it forbids.
set(external_names MODEL SAMPLER ARCHITECTURE STYLE LANDSCAPE FORMATS)
list(JOIN external_names "|" external_alt)
set(external_re "(^|[^A-Za-z0-9_])(${external_alt})[.]md([^A-Za-z0-9_]|$)")
set(external_dir_re "[.][.]/shared/")
set(S "§")  # two bytes in UTF-8: always group it before applying ? or *
set(number_re "[0-9]+([.][0-9]+)*")
# CMake regexes allow 9 groups: match a loose run of section text here, parse it in cited_sections.
set(sections_re "( *(${S}|section ) *[0-9][-0-9.,${S} ]*)")
set(docs_cite_re "(^|[^A-Za-z0-9_./-]|[.][.]/)docs/([A-Za-z0-9_-]+)[.]md${sections_re}?")
set(bare_cite_re "(^|[^A-Za-z0-9_./-])([A-Za-z0-9_-]+)[.]md${sections_re}")
set(skip_re "^tests/fixtures/|^tests/fuzz/corpus/|(^|/)[.]venv/|(^|/)__pycache__/|^tools/train/data/")
set(binary_re "[.](safetensors|bin|gguf|npy|npz|pt|pth|onnx|png|jpg|jpeg|gif|webp|pdf|gz|xz|zst|zip|tar|so|a|o)$")

execute_process(
  COMMAND git -C "${ROOT}" -c core.quotepath=off ls-files -- include examples benchmarks tests tools docs scripts
          README.md models
  OUTPUT_VARIABLE listing
  ERROR_VARIABLE git_error
  RESULT_VARIABLE git_rc)
if(NOT git_rc EQUAL 0)
  message(FATAL_ERROR "doc_links.cmake: git ls-files failed in ${ROOT}: ${git_error}")
endif()
string(REPLACE "\n" ";" files "${listing}")

# Placeholders keep CMake's list splitting away from ; [ ] and \ in the text.
string(ASCII 1 ph_semi)
string(ASCII 2 ph_open)
string(ASCII 3 ph_close)
string(ASCII 4 ph_backslash)

# Loads the numbered headings of docs/<name>.md once: sets doc_exists_<name>, doc_sections_<name>.
function(load_doc name)
  if(DEFINED doc_exists_${name})
    return()
  endif()
  set(path "${ROOT}/docs/${name}.md")
  if(NOT EXISTS "${path}")
    set(doc_exists_${name} FALSE PARENT_SCOPE)
    return()
  endif()
  file(READ "${path}" text)
  string(REGEX MATCHALL "\n#+ +${number_re}" heads "\n${text}")
  set(numbers "")
  foreach(h IN LISTS heads)
    string(REGEX REPLACE "^\n#+ +" "" n "${h}")
    list(APPEND numbers "${n}")
  endforeach()
  set(doc_exists_${name} TRUE PARENT_SCOPE)
  set(doc_sections_${name} "${numbers}" PARENT_SCOPE)
endfunction()

# The section numbers of a run like " §3.5-3.6", " §2-§6", " §3.5, §3.6, 30 layers", " section 9":
# the first number, then each "-N", "-§N" or ", §N" that follows it.
function(cited_sections run out)
  set(numbers "")
  if(run MATCHES "^ *(${S}|section ) *(${number_re})")
    list(APPEND numbers "${CMAKE_MATCH_2}")
    string(LENGTH "${CMAKE_MATCH_0}" at)
    string(SUBSTRING "${run}" ${at} -1 run)
    while(run MATCHES "^(-(${S})?|, *${S} *)(${number_re})")
      list(APPEND numbers "${CMAKE_MATCH_3}")
      string(LENGTH "${CMAKE_MATCH_0}" at)
      string(SUBSTRING "${run}" ${at} -1 run)
    endwhile()
  endif()
  set(${out} "${numbers}" PARENT_SCOPE)
endfunction()

set(errors "")
set(scanned 0)
set(citations 0)

# Checks one citation of doc `name` with section text `sections` ("" when none) found at `where`.
macro(check_citation name sections where shown_raw)
  math(EXPR citations "${citations} + 1")
  string(REGEX REPLACE "[ ,.-]+$" "" shown "${shown_raw}")
  load_doc("${name}")
  if(NOT doc_exists_${name})
    string(APPEND errors "\n  ${where}: docs/${name}.md does not exist (${shown})")
  else()
    cited_sections("${sections}" cited)
    foreach(n IN LISTS cited)
      if(NOT n IN_LIST doc_sections_${name})
        string(APPEND errors "\n  ${where}: docs/${name}.md has no section ${n} (${shown})")
      endif()
    endforeach()
  endif()
endmacro()

foreach(f IN LISTS files)
  if(f STREQUAL "" OR f MATCHES "${skip_re}" OR f MATCHES "${binary_re}")
    continue()
  endif()
  if(f MATCHES "^models/" AND NOT f MATCHES "^models/[^/]+/README[.]md$")
    continue()
  endif()
  if(NOT EXISTS "${ROOT}/${f}" OR IS_DIRECTORY "${ROOT}/${f}")
    continue()  # deleted in the work tree, or a submodule
  endif()
  math(EXPR scanned "${scanned} + 1")
  file(READ "${ROOT}/${f}" text)
  if(NOT text MATCHES "[.]md|${external_dir_re}")
    continue()
  endif()
  set(in_docs FALSE)
  if(f MATCHES "^docs/")
    set(in_docs TRUE)
  endif()
  string(REPLACE "\\" "${ph_backslash}" text "${text}")
  string(REPLACE ";" "${ph_semi}" text "${text}")
  string(REPLACE "[" "${ph_open}" text "${text}")
  string(REPLACE "]" "${ph_close}" text "${text}")
  string(REPLACE "\r" "" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    if(NOT line MATCHES "[.]md|${external_dir_re}")
      continue()
    endif()
    set(where "${f}:${number}")
    # (c) out-of-repository design and spec files. After each hit, keep its trailing boundary
    # character so that a name right behind it is still found.
    set(rest "${line}")
    while(rest MATCHES "${external_re}")
      set(cited "${CMAKE_MATCH_2}.md")
      string(FIND "${rest}" "${CMAKE_MATCH_0}" at)
      string(LENGTH "${CMAKE_MATCH_0}" skip)
      string(LENGTH "${CMAKE_MATCH_3}" tail)
      math(EXPR at "${at} + ${skip} - ${tail}")
      string(SUBSTRING "${rest}" ${at} -1 rest)
      if(rest MATCHES "^${sections_re}")
        string(APPEND cited "${CMAKE_MATCH_1}")
        string(REGEX REPLACE "[ ,.-]+$" "" cited "${cited}")
      endif()
      string(APPEND errors "\n  ${where}: cites ${cited}, which is not part of the repository")
    endwhile()
    if(line MATCHES "${external_dir_re}")
      string(APPEND errors "\n  ${where}: refers to ${CMAKE_MATCH_0}, which is outside the repository")
    endif()
    # (a), (b) docs/<name>.md with optional sections.
    string(REGEX MATCHALL "${docs_cite_re}" found "${line}")
    foreach(m IN LISTS found)
      string(REGEX MATCH "docs/([A-Za-z0-9_-]+)[.]md(.*)$" shown "${m}")
      set(name "${CMAKE_MATCH_1}")
      set(sections "${CMAKE_MATCH_2}")
      check_citation("${name}" "${sections}" "${where}" "${shown}")
    endforeach()
    if(in_docs)
      # Bare <name>.md §N citations inside docs/.
      string(REGEX MATCHALL "${bare_cite_re}" found "${line}")
      foreach(m IN LISTS found)
        string(REGEX MATCH "([A-Za-z0-9_-]+)[.]md(.*)$" shown "${m}")
        set(name "${CMAKE_MATCH_1}")
        set(sections "${CMAKE_MATCH_2}")
        check_citation("${name}" "${sections}" "${where}" "${shown}")
      endforeach()
      # Markdown links to a sibling doc: ](<name>.md) or ](./<name>.md#anchor).
      string(REGEX MATCHALL "${ph_close}[(]([.]/)?[A-Za-z0-9_-]+[.]md[)#]" found "${line}")
      foreach(m IN LISTS found)
        string(REGEX MATCH "([A-Za-z0-9_-]+)[.]md" shown "${m}")
        check_citation("${CMAKE_MATCH_1}" "" "${where}" "${shown}")
      endforeach()
    endif()
  endforeach()
endforeach()

if(errors)
  string(REPLACE "${ph_backslash}" "\\" errors "${errors}")
  string(REPLACE "${ph_semi}" ";" errors "${errors}")
  string(REPLACE "${ph_open}" "[" errors "${errors}")
  string(REPLACE "${ph_close}" "]" errors "${errors}")
  message(FATAL_ERROR "documentation citations broken (docs/ is the only place for design and spec facts):${errors}")
endif()
message(STATUS "doc links: ${citations} citations in ${scanned} files all resolve in ${ROOT}/docs")
