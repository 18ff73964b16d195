# `cmake --build <dir> --target coverage` in a -DWORKER_COVERAGE=ON build: runs the tests and
# writes the lcov summary (coverage-summary.txt) and HTML (coverage-html/) into the build folder.
if(WORKER_COVERAGE)
  add_custom_target(coverage
    COMMAND ${CMAKE_SOURCE_DIR}/ci/coverage.sh ${CMAKE_BINARY_DIR}
            ${CMAKE_BINARY_DIR}/coverage-summary.txt
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    USES_TERMINAL
    COMMENT "Running the tests and lcov")
endif()
