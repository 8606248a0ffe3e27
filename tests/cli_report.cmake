# report.html of `torchprobe compare`, opened in headless Chromium as a person would open it: the
# page renders, its script runs to the end without a console message, and the first source that
# first_divergence.json names is on the page.
#   cmake -DCLI=<torchprobe> -DREF=<reference-dumps> -DWORK=<dir> -P cli_report.cmake
set(step0 ${REF}/stat_mix/step0)
set(step1 ${REF}/stat_mix/step1)
if(NOT EXISTS ${step0}/proc10163/dump.json)
  message(FATAL_ERROR "no reference dumps at ${REF}")
endif()
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CLI} compare ${step0} ${step1} -o ${WORK} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 1 OR NOT EXISTS ${WORK}/report.html)
  message(FATAL_ERROR "torchprobe compare: exit status ${rc} (expected 1) or no report.html\n${err}")
endif()
# The skip comes after every check that needs no browser, and nothing follows it: CTest's
# SKIP_REGULAR_EXPRESSION would report a failure after it as a skip.
find_program(BROWSER NAMES chromium chromium-browser google-chrome)
if(NOT BROWSER)
  message("SKIPPED: report.html not opened: no chromium (apt-get install chromium)")
  return()
endif()
file(READ ${WORK}/first_divergence.json fd)
string(JSON source GET "${fd}" first_divergence entry)

execute_process(COMMAND ${BROWSER} --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0
                        --user-data-dir=${WORK}/profile --dump-dom file://${WORK}/report.html
                TIMEOUT 120 RESULT_VARIABLE rc OUTPUT_VARIABLE dom ERROR_VARIABLE console)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BROWSER} exited with ${rc}:\n${console}")
endif()
# Chromium logs each console message (an uncaught exception too) as ":CONSOLE"; the page logs none.
string(REGEX MATCHALL "[^\n]*:CONSOLE[^\n]*" messages "${console}")
if(messages)
  message(FATAL_ERROR "report.html wrote to the console:\n${messages}")
endif()
string(FIND "${dom}" "data-ready=\"1\"" ready)
if(ready EQUAL -1)
  message(FATAL_ERROR "report.html's script did not run to its end (no data-ready on <body>)")
endif()
string(FIND "${dom}" "<span id=\"source-name\">${source}</span>" named)
if(named EQUAL -1)
  message(FATAL_ERROR "the page does not name the first source ${source} in its answer box")
endif()
string(FIND "${dom}" "<svg id=\"chart\"" chart)
string(FIND "${dom}" "<table id=\"entries\"" table)
if(chart EQUAL -1 OR table EQUAL -1)
  message(FATAL_ERROR "report.html lacks its chart or its table")
endif()
message(STATUS "report.html renders in ${BROWSER} and names ${source}")
