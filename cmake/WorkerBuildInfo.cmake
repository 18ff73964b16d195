# Build identity for `worker-orcd --version` and /health (issue 17): the git commit at configure
# time ("unknown" outside a git checkout), the build date and type, and the CUDA architectures
# ("cpu-only" without the CUDA backend). Configure re-runs when HEAD moves, so the commit
# follows checkouts and commits. Usable in script mode too (tools/tests/test_build.py).
function(worker_build_info source_dir out_header)
  set(WORKER_GIT_COMMIT "unknown")
  find_program(WORKER_GIT_EXECUTABLE git)
  if(WORKER_GIT_EXECUTABLE)
    execute_process(COMMAND ${WORKER_GIT_EXECUTABLE} -C "${source_dir}" rev-parse --short=12 HEAD
                    OUTPUT_VARIABLE commit RESULT_VARIABLE rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND commit MATCHES "^[0-9a-f]+$")
      set(WORKER_GIT_COMMIT "${commit}")
      execute_process(COMMAND ${WORKER_GIT_EXECUTABLE} -C "${source_dir}" rev-parse
                              --path-format=absolute --git-path HEAD --git-path logs/HEAD
                      OUTPUT_VARIABLE paths ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      string(REPLACE "\n" ";" paths "${paths}")
      foreach(p IN LISTS paths)
        if(EXISTS "${p}" AND NOT CMAKE_SCRIPT_MODE_FILE)
          set_property(DIRECTORY "${CMAKE_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${p}")
        endif()
      endforeach()
    endif()
  endif()
  string(TIMESTAMP WORKER_BUILD_DATE "%Y-%m-%dT%H:%M:%SZ" UTC)  # honours SOURCE_DATE_EPOCH
  set(WORKER_BUILD_TYPE "${CMAKE_BUILD_TYPE}")
  if(NOT WORKER_BUILD_TYPE)
    set(WORKER_BUILD_TYPE "unspecified")
  endif()
  if(WORKER_HAVE_CUDA)
    string(REPLACE ";" " " WORKER_BUILD_CUDA_ARCH "${CMAKE_CUDA_ARCHITECTURES}")
  else()
    set(WORKER_BUILD_CUDA_ARCH "cpu-only")
  endif()
  configure_file("${CMAKE_CURRENT_FUNCTION_LIST_DIR}/build_info.h.in" "${out_header}" @ONLY)
endfunction()
