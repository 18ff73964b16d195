# worker_add_gtest(NAME SOURCES a.cpp b.cpp LIBS lib1 lib2 [LABELS l1 l2] [KEEP_OPT])
# Builds one gtest binary and registers it with CTest; every run writes gtest XML into
# ${WORKER_TEST_RESULTS_DIR}/<NAME>.xml, which tools/reqcov.py joins with the
# "// REQ:" declarations in the test sources.
#
# WORKER_TEST_CXX_OPT (e.g. -O1, -O0): the optimisation level of test code only (the gtest
# binaries and the conformance harness), which asserts and drives but computes little; the
# code under test keeps the build type's. CI sets it: test code is half of the compile time.
# KEEP_OPT: a test whose own code computes (scans model files, log-softmax over the vocabulary)
# keeps the build type's level (at -O0 under ASan those took minutes).
set(WORKER_TEST_CXX_OPT "" CACHE STRING "Optimisation flag for test code only (empty: the build type's)")
function(worker_test_code_options target)
  if(WORKER_TEST_CXX_OPT AND NOT WORKER_COVERAGE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${WORKER_TEST_CXX_OPT}>)
  endif()
endfunction()

function(worker_add_gtest name)
  cmake_parse_arguments(T "KEEP_OPT" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  if(NOT T_KEEP_OPT)
    worker_test_code_options(${name})
  endif()
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock
                                        worker_warnings Threads::Threads)
  target_compile_definitions(${name} PRIVATE
    WORKER_SOURCE_DIR="${CMAKE_SOURCE_DIR}" WORKER_BINARY_DIR="${CMAKE_BINARY_DIR}")
  add_test(NAME ${name}
           COMMAND ${name} --gtest_output=xml:${WORKER_TEST_RESULTS_DIR}/${name}.xml)
  set_tests_properties(${name} PROPERTIES ENVIRONMENT
    "WORKER_SOURCE_DIR=${CMAKE_SOURCE_DIR};WORKER_BINARY_DIR=${CMAKE_BINARY_DIR}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
