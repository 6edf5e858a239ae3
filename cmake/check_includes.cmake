# The include directions of docs/design.md ("Dependency direction"), checked over the sources: every `#include "..."`
# in the project's own .h/.cpp/.cu/.cuh/.inc files (tests/fixtures/ left out) against the rules
# below. The module libraries share one include root, so the compiler cannot refuse an include
# against the direction; this script does, and the build runs it before compiling anything.
#
#   cmake -DSOURCE_DIR=<repo root> [-DSTAMP=<file touched on success>] -P cmake/check_includes.cmake
#
# A file's scope is its top directory, except under engine/: engine/kernels/ and engine/model/ are
# scopes of their own, and engine/'s top-level files are `engine`. Each scope lists what it may
# include: a directory (ending in /) or one exact header. An include of a directory also admits
# its subdirectories (engine/ admits engine/model/...). Outside text/, only text/'s public headers
# (CRL_TEXT_PUBLIC): its Jinja interpreter (text/jinja/) and tokenizer.json parts (text/hf/) are
# its own.
cmake_minimum_required(VERSION 3.18)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_includes.cmake: pass -DSOURCE_DIR=<repository root>")
endif()

set(CRL_SCOPES common kv sync text engine/kernels engine/model engine trainer server bench
    app tests)
set(CRL_TEXT_PUBLIC text/tokenizer.h text/chat_template.h text/builtin_chat_template.h
    text/chat_encoder.h text/chat_trajectory.h text/tool_calls.h text/template_error.h text/utf8.h)
set(allow_common common/)
set(allow_kv common/ kv/)
set(allow_sync common/ sync/)
set(allow_text common/ text/)
set(allow_engine/kernels common/ engine/kernels/)
set(allow_engine/model common/ kv/ engine/kernels/ ${CRL_TEXT_PUBLIC} engine/model/)
# From sync/, the engine sees only the narrow interfaces: the weight layout, the weight source and
# the tensor-parallel group.
set(allow_engine common/ kv/ ${CRL_TEXT_PUBLIC} engine/ sync/weight_layout.h sync/weight_source.h
    sync/tp_group.h)
set(allow_trainer common/ sync/ ${CRL_TEXT_PUBLIC} engine/ trainer/)
set(allow_server common/ ${CRL_TEXT_PUBLIC} engine/ server/)
# The benchmarks are a library of the colocated-rl binary: any library module, never app/.
set(allow_bench common/ kv/ sync/ ${CRL_TEXT_PUBLIC} engine/ trainer/ server/ bench/)
set(allow_app *)
set(allow_tests *)

# The scope of a repository-relative path (a source file or an included header).
function(crl_scope_of path out)
  foreach(prefix engine/kernels/ engine/model/)
    string(FIND "${path}" "${prefix}" at)
    if(at EQUAL 0)
      string(REGEX REPLACE "/$" "" scope "${prefix}")
      set(${out} "${scope}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  string(REGEX MATCH "^[^/]+/" top "${path}")
  string(REGEX REPLACE "/$" "" top "${top}")
  set(${out} "${top}" PARENT_SCOPE)
endfunction()

set(files "")
foreach(dir common kv sync text engine trainer server bench app tests)
  file(GLOB_RECURSE found RELATIVE "${SOURCE_DIR}"
       "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.hpp" "${SOURCE_DIR}/${dir}/*.cpp"
       "${SOURCE_DIR}/${dir}/*.cu" "${SOURCE_DIR}/${dir}/*.cuh" "${SOURCE_DIR}/${dir}/*.inc")
  list(FILTER found EXCLUDE REGEX "^tests/fixtures/")
  list(APPEND files ${found})
endforeach()
list(SORT files)

set(violations 0)
foreach(file IN LISTS files)
  crl_scope_of("${file}" scope)
  if(NOT scope IN_LIST CRL_SCOPES)
    message(FATAL_ERROR "check_includes.cmake: no include rule for ${file} (scope '${scope}')")
  endif()
  set(allowed ${allow_${scope}})
  if(allowed STREQUAL "*")
    continue()
  endif()
  file(READ "${SOURCE_DIR}/${file}" text)
  # Directives at the start of a line (after blanks): not an #include quoted in a comment.
  string(REGEX MATCHALL "(^|\n)[ \t]*#[ \t]*include[ \t]*\"[^\"\n]*\"" directives "${text}")
  foreach(directive IN LISTS directives)
    string(REGEX REPLACE "^.*\"([^\"]*)\"$" "\\1" header "${directive}")
    set(ok FALSE)
    foreach(entry IN LISTS allowed)
      if(entry MATCHES "/$")
        string(FIND "${header}" "${entry}" at)
        if(at EQUAL 0)
          set(ok TRUE)
        endif()
      elseif(header STREQUAL entry)
        set(ok TRUE)
      endif()
    endforeach()
    if(ok)
      continue()
    endif()
    # The line number: the newlines before the directive, plus one.
    string(REGEX REPLACE "^\n" "" bare "${directive}")
    string(FIND "${text}" "${bare}" at)
    string(SUBSTRING "${text}" 0 ${at} before)
    string(REGEX MATCHALL "\n" newlines "${before}")
    list(LENGTH newlines line)
    math(EXPR line "${line} + 1")
    string(REGEX REPLACE "/(;|$)" "\\1" described "${allowed}")
    string(REPLACE "${CRL_TEXT_PUBLIC}" "text/'s public headers" described "${described}")
    string(REPLACE ";" ", " described "${described}")
    message(NOTICE "${file}:${line}: ${scope} may not include ${header} "
                   "(docs/design.md, dependency direction: ${scope} may include ${described})")
    math(EXPR violations "${violations} + 1")
  endforeach()
endforeach()

if(violations GREATER 0)
  message(FATAL_ERROR "${violations} include(s) against the dependency direction of docs/design.md "
                      "(rules: cmake/check_includes.cmake)")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()
