# Warnings, sanitizers and coverage applied to every target of the project.
add_library(worker_warnings INTERFACE)
target_compile_options(worker_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
    -Wunused -Woverloaded-virtual -Wpedantic -Wnull-dereference -Wdouble-promotion -Wformat=2
    -Wimplicit-fallthrough>)
if(WORKER_WERROR)
  target_compile_options(worker_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
                                                   $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
if(WORKER_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=address,undefined)
endif()
if(WORKER_SANITIZE OR WORKER_TSAN)
  # GCC's flow analysis gives false maybe-uninitialized warnings in libstdc++ (<regex>,
  # std::function) under the sanitizers' instrumentation; the plain build keeps the warning.
  add_compile_options($<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>)
endif()
if(WORKER_TSAN)
  if(WORKER_SANITIZE)
    message(FATAL_ERROR "WORKER_TSAN and WORKER_SANITIZE cannot be combined (ThreadSanitizer "
                        "excludes AddressSanitizer); use two build folders")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=thread)
endif()
if(WORKER_COVERAGE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:--coverage> $<$<COMPILE_LANGUAGE:CXX>:-O0>)
  add_link_options(--coverage)
endif()
