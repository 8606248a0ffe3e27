# `torchprobe ranks` on a hand-written three-rank dump (tests/data/ranks): the whole dump names the
# planted fault and exits 1, its agreeing first step exits 0, and a path that is no directory
# exits 2 with a message naming it.
#   cmake -DCLI=<torchprobe> -DDATA=<tests/data/ranks> -P cli_ranks.cmake
function(run_ranks path expected_rc)
  execute_process(COMMAND ${CLI} ranks ${path} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "torchprobe ranks ${path}: exit status ${rc}, expected ${expected_rc}\n${out}${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect_line text line)
  string(FIND "${text}" "${line}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected the line\n  ${line}\nin\n${text}")
  endif()
endfunction()

run_ranks(${DATA} 1)
expect_line("${out}" "step 0: ranks 0,1,2\n")
expect_line("${out}" "  Distributed.all_reduce.0.forward  entered by 0,1,2; inputs differ, outputs agree\n")
expect_line("${out}"
            "first disagreement: step 1, rank 2, Aten.t.0.forward input_args.0 (shape [4,8]) differs from ranks 0,1\n")

run_ranks(${DATA}/step0 0)
expect_line("${out}" "the ranks agree on every replicated value\n")

run_ranks(${DATA}/no_such_step 2)
expect_line("${err}" "torchprobe ranks: ${DATA}/no_such_step: not a directory")
message(STATUS "torchprobe ranks names step 1, rank 2, Aten.t.0.forward")
