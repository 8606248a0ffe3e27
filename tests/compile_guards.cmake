# CTest's compile_guards: <torchprobe/torchprobe.hpp> stops the build with its message when NDEBUG
# or -fopenmp is missing (README, "Compile flags"). -Wfatal-errors stops at the guard, before
# libtorch's headers: each check takes a fraction of a second.
#   cmake -DCXX=<compiler> -DINCLUDE=<include dir> -DWORK=<dir> -P compile_guards.cmake
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/uses_torchprobe.cpp "#include <torchprobe/torchprobe.hpp>\n")
function(expect_refusal what expected)
  execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only -Wfatal-errors -I${INCLUDE} ${ARGN} ${WORK}/uses_torchprobe.cpp
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "${expected}")
    message(FATAL_ERROR "without ${what}: exit ${rc}, expected a failure saying /${expected}/:\n${out}${err}")
  endif()
endfunction()
expect_refusal("NDEBUG" "TorchProbe must be compiled with -DNDEBUG" -fopenmp)
expect_refusal("-fopenmp" "TorchProbe expects -fopenmp" -DNDEBUG)
message(STATUS "torchprobe.hpp refuses a build without NDEBUG and one without -fopenmp, saying why")
