# Decides whether the CUDA backend is built. It is, whenever a CUDA toolkit is found (unless
# GPUPOOL_WITH_CUDA=OFF); the library also builds with no toolkit at all, CPU backend only.
set(GPUPOOL_HAS_CUDA OFF)
if(NOT GPUPOOL_WITH_CUDA STREQUAL "OFF")
  # The toolkit's usual home, for shells (and pip builds) that do not have nvcc on PATH.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Which GPUs the built-in kernels have machine code for. The one setting is
    # GPUPOOL_CUDA_ARCHITECTURES (a CMake cache variable; its first value comes from the
    # environment variable of that name, which `pip install .` passes through): a CMake
    # architecture list such as "90", "80;90", "native" (the GPUs of this machine) or the
    # default: Turing, Ampere, Ada and Hopper as machine code, and Hopper's PTX, which the driver
    # compiles for newer GPUs. An explicit CMAKE_CUDA_ARCHITECTURES still wins.
    set(GPUPOOL_DEFAULT_CUDA_ARCHITECTURES "75-real;80-real;86-real;89-real;90")
    if(DEFINED ENV{GPUPOOL_CUDA_ARCHITECTURES} AND NOT "$ENV{GPUPOOL_CUDA_ARCHITECTURES}" STREQUAL "")
      set(_gpupool_archs "$ENV{GPUPOOL_CUDA_ARCHITECTURES}")
    else()
      set(_gpupool_archs "${GPUPOOL_DEFAULT_CUDA_ARCHITECTURES}")
    endif()
    set(GPUPOOL_CUDA_ARCHITECTURES "${_gpupool_archs}" CACHE STRING
      "GPU architectures of the CUDA backend (e.g. 90, 80;90, native; default: 75..90 and PTX)")
    if(DEFINED ENV{GPUPOOL_CUDA_ARCHITECTURES} AND NOT "$ENV{GPUPOOL_CUDA_ARCHITECTURES}" STREQUAL "")
      # The environment, when set, wins over what an earlier configure cached.
      set_property(CACHE GPUPOOL_CUDA_ARCHITECTURES PROPERTY VALUE "${_gpupool_archs}")
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${GPUPOOL_CUDA_ARCHITECTURES}")
    endif()
    enable_language(CUDA)
    # CMake 3.25 predates nvcc's C++20 support; teach it the flag.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(GPUPOOL_HAS_CUDA ON)
  elseif(GPUPOOL_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GPUPOOL_WITH_CUDA=ON but no CUDA compiler was found (set CUDACXX)")
  endif()
endif()
if(GPUPOOL_HAS_CUDA)
  set(GPUPOOL_HAS_CUDA_VALUE 1)
  message(STATUS "gpupool: CUDA backend ON (architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  set(GPUPOOL_HAS_CUDA_VALUE 0)
  message(STATUS "gpupool: CUDA backend OFF (CPU backend only)")
endif()
