# Warnings (as errors in this project's own builds) and optional sanitizers, for host code.
function(gpupool_set_warnings target)
  # GCC 12 warns about members left out of designated initializers, the way options are meant
  # to be written (`{.lanes_per_device = 2}`); GCC 13 no longer does.
  set(flags -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
            -Wno-missing-field-initializers)
  if(GPUPOOL_WARNINGS_AS_ERRORS)
    list(APPEND flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${flags}>")
  if(GPUPOOL_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Wall>")
  endif()
endfunction()

if(GPUPOOL_SANITIZE)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${GPUPOOL_SANITIZE};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  add_link_options("-fsanitize=${GPUPOOL_SANITIZE}")
endif()
