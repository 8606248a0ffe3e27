# CTest's skip_reporting: what tests/skip.hpp and the runner (doctest_main.cpp) promise, run on the
# unit executable's own skip cases (unit/skip_self_test.cpp):
#   - a run where every case skipped exits 77 (CTest's SKIP_RETURN_CODE: reported skipped, not passed)
#     and names the case and its reason;
#   - a run where one case skipped and another passed exits 0 and still lists the skip;
#   - TP_SKIP in a case outside a needs_ suite fails that case.
#   cmake -DEXE=<torchprobe_unit_tests> -P skip_reporting.cmake
function(run_exe out_rc out_text)
  execute_process(COMMAND ${EXE} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

run_exe(rc text --test-suite=needs_skip_selfcheck)
if(NOT rc EQUAL 77 OR NOT text MATCHES "SKIPPED: the skip mechanism's own check"
   OR NOT text MATCHES "\\[torchprobe\\] 1 of 1 test cases skipped at run time"
   OR NOT text MATCHES "needs_skip_selfcheck: a case that cannot run here skips")
  message(FATAL_ERROR "a run whose every case skipped: exit ${rc} (expected 77) or no report of the skip:\n${text}")
endif()

run_exe(rc text "--test-case=a case that cannot run here*,create_directories: nested*")
if(NOT rc EQUAL 0 OR NOT text MATCHES "\\[torchprobe\\] 1 of 2 test cases skipped at run time")
  message(FATAL_ERROR "one case skipped, one passed: exit ${rc} (expected 0) or the skip not listed:\n${text}")
endif()

run_exe(rc text --test-suite=skip_selfcheck_outside --no-skip)
if(rc EQUAL 0 OR NOT text MATCHES "TP_SKIP in a test case outside a needs_ suite")
  message(FATAL_ERROR "TP_SKIP outside a needs_ suite: exit ${rc} (expected a failure naming the rule):\n${text}")
endif()
message(STATUS "skips are reported as skips: exit 77 when all skipped, listed when some, refused outside needs_ suites")
