# ctest's task_contract test: builds tests/contract/broken_tasks.cpp, which must not compile, and
# checks that the compiler's messages name each broken part of the task contract.
#   cmake -DBUILD_DIR=... -DTARGET=torchprobe_broken_tasks -P check_contract.cmake
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "broken_tasks.cpp compiled: the task and sink contracts let three broken tasks and a broken sink through")
endif()
foreach(expected
    "a task needs `bool keep\\(Record&\\)`"
    "a task needs `nlohmann::ordered_json describe\\(const at::Tensor&, const Site&, Record&"
    "a task with `ended\\(\\)` needs `std::string end_reason\\(\\) const`"
    "a sink needs `void open\\(const std::string& directory\\)`"
    "this task does not support this level")
  if(NOT text MATCHES "${expected}")
    message(FATAL_ERROR "the build of broken_tasks.cpp failed without the message /${expected}/:\n${text}")
  endif()
endforeach()
message(STATUS "each broken task and sink was refused with a message that names what it lacks")
