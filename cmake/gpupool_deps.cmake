
# Header-only dependencies, from the system (Debian: nlohmann-json3-dev, libcli11-dev) or from
# .deps/ (scripts/stage-deps copies them there for machines without a package registry).
# Each defines an INTERFACE target with the headers as SYSTEM includes; linking it only
# privately keeps it out of the installed package's interface.

# gpupool_header_dependency(TARGET PACKAGE IMPORTED HEADER DEPS_SUBDIR [VERSION]): TARGET links
# the package's IMPORTED target when find_package(PACKAGE) finds it, else HEADER's folder under
# .deps/DEPS_SUBDIR/include.
function(gpupool_header_dependency target package imported header deps_subdir)
  if(TARGET ${target})
    return()
  endif()
  add_library(${target} INTERFACE)
  find_package(${package} ${ARGN} CONFIG QUIET)
  if(TARGET ${imported})
    target_link_libraries(${target} INTERFACE ${imported})
  else()
    find_path(${target}_include_dir ${header}
      PATHS ${PROJECT_SOURCE_DIR}/.deps/${deps_subdir}/include REQUIRED)
    target_include_directories(${target} SYSTEM INTERFACE ${${target}_include_dir})
  endif()
endfunction()

# nlohmann-json, for the JSON the trace writers and the tool produce.
gpupool_header_dependency(gpupool_json nlohmann_json nlohmann_json::nlohmann_json
  nlohmann/json.hpp nlohmann_json 3.9)
# CLI11, for the command-line tool.
gpupool_header_dependency(gpupool_cli11 CLI11 CLI11::CLI11 CLI/CLI.hpp CLI11)
