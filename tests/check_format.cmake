# Fails when a C++ source of the repository differs from what clang-format makes of it with the
# repository's .clang-format (single_include/ is generated and not checked).
file(GLOB_RECURSE sources RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/include/*.hpp ${SOURCE_DIR}/tests/*.hpp ${SOURCE_DIR}/tests/*.cpp
     ${SOURCE_DIR}/benchmarks/*.hpp ${SOURCE_DIR}/benchmarks/*.cpp ${SOURCE_DIR}/examples/*.cpp)
set(bad "")
foreach(source IN LISTS sources)
  execute_process(COMMAND ${CLANG_FORMAT} --style=file --dry-run --Werror ${source}
                  WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND bad ${source})
  endif()
endforeach()
list(LENGTH sources checked)
if(bad)
  list(JOIN bad "\n  " shown)
  message(FATAL_ERROR "not formatted with .clang-format (run clang-format -i --style=file on them):\n  ${shown}")
endif()
message(STATUS "${checked} sources formatted as .clang-format says")
