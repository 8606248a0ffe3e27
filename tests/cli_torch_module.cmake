# The tool's libtorch part is a module it loads only when a command needs it (tools/cli/torch_module.hpp):
# `run_ut` reaches it from the build tree; a compare of statistics dumps and `--version` never load it
# (checked where the module is absent: a copy of the tool alone in a directory); there `run_ut` exits 2
# with a message naming the module and every place searched.
#   cmake -DCLI=<torchprobe> -DREF=<tests/data/reference-dumps> -DWORK=<dir> -P cli_torch_module.cmake
execute_process(COMMAND ${CLI} run_ut --help RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "-api_info")
  message(FATAL_ERROR "torchprobe run_ut --help: exit ${rc}\n${out}${err}")
endif()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/alone)
file(COPY ${CLI} DESTINATION ${WORK}/alone)
get_filename_component(name ${CLI} NAME)
set(alone ${WORK}/alone/${name})

execute_process(COMMAND ${alone} --version RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^torchprobe ")
  message(FATAL_ERROR "torchprobe --version without the module: exit ${rc}\n${out}${err}")
endif()

set(stat ${REF}/stat_mix)
if(NOT EXISTS ${stat}/step0)
  message(FATAL_ERROR "no reference dumps at ${REF}")
endif()
if(TRUE)
  file(GLOB t ${stat}/step0/*/dump.json)
  file(GLOB b ${stat}/step1/*/dump.json)
  execute_process(COMMAND ${alone} compare ${t} ${b} -o ${WORK}/out RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 1)  # step0 against step1: diverged, the statistics compared without libtorch
    message(FATAL_ERROR "torchprobe compare without the module: exit ${rc}, expected 1\n${out}${err}")
  endif()
endif()

execute_process(COMMAND ${alone} run_ut -api_info ${WORK}/none.json RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "torchprobe run_ut without the module: exit ${rc}, expected 2\n${out}${err}")
endif()
foreach(part "needs libtorch" "libtorchprobe_torch.so" "${WORK}/alone/libtorchprobe_torch.so: not there")
  string(FIND "${err}" "${part}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "torchprobe run_ut without the module: the message lacks \"${part}\":\n${err}")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
