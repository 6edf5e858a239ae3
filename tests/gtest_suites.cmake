# Writes one ctest entry per GoogleTest suite of a test binary (run after each build of it):
#   cmake -DTEST_EXE=... -DWORK_DIR=... -DOUT=... -P gtest_suites.cmake
#
# One process per suite rather than per test: crl_tests takes ~1 s to start (libtorch's static
# initialisation), which per test was two thirds of the unit tests' time. A suite's failing tests
# are named in its output (ctest --output-on-failure); `crl_tests --gtest_filter=Suite.Name` runs
# one alone. Suites named Cuda* skip every test without a device and are reported as skipped.
execute_process(COMMAND "${TEST_EXE}" --gtest_list_tests
                WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE listing
                ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TEST_EXE} --gtest_list_tests failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
foreach(line IN LISTS lines)
  # Suite lines start in column 0 and end with '.' (a parameterized suite adds "  # TypeParam ...").
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND script
           "add_test([=[${suite}]=] \"${TEST_EXE}\" [=[--gtest_filter=${suite}.*]=])\n")
    set(props "WORKING_DIRECTORY \"${WORK_DIR}\" LABELS unit")
    if(suite MATCHES "^Cuda")
      string(APPEND props " SKIP_REGULAR_EXPRESSION [=[\\[  SKIPPED \\]]=]")
    endif()
    string(APPEND script "set_tests_properties([=[${suite}]=] PROPERTIES ${props})\n")
  endif()
endforeach()
if(script STREQUAL "")
  message(FATAL_ERROR "${TEST_EXE} --gtest_list_tests listed no suite")
endif()
file(WRITE "${OUT}" "${script}")
