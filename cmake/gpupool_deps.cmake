# Header-only dependencies, from the system (Debian: nlohmann-json3-dev, libcli11-dev) or from
# .deps/ (scripts/stage-deps copies them there for machines without a package registry).
# Each defines an INTERFACE target with the headers as SYSTEM includes; linking it only
# privately keeps it out of the installed package's interface.

# gpupool_json: nlohmann-json, for the JSON the trace writers and the tool produce.
if(NOT TARGET gpupool_json)
  add_library(gpupool_json INTERFACE)
  find_package(nlohmann_json 3.9 CONFIG QUIET)
  if(TARGET nlohmann_json::nlohmann_json)
    target_link_libraries(gpupool_json INTERFACE nlohmann_json::nlohmann_json)
  else()
    find_path(GPUPOOL_JSON_INCLUDE_DIR nlohmann/json.hpp
      PATHS ${PROJECT_SOURCE_DIR}/.deps/nlohmann_json/include REQUIRED)
    target_include_directories(gpupool_json SYSTEM INTERFACE ${GPUPOOL_JSON_INCLUDE_DIR})
  endif()
endif()

# gpupool_cli11: CLI11, for the command-line tool.
if(NOT TARGET gpupool_cli11)
  add_library(gpupool_cli11 INTERFACE)
  find_package(CLI11 CONFIG QUIET)
  if(TARGET CLI11::CLI11)
    target_link_libraries(gpupool_cli11 INTERFACE CLI11::CLI11)
  else()
    find_path(GPUPOOL_CLI11_INCLUDE_DIR CLI/CLI.hpp
      PATHS ${PROJECT_SOURCE_DIR}/.deps/CLI11/include REQUIRED)
    target_include_directories(gpupool_cli11 SYSTEM INTERFACE ${GPUPOOL_CLI11_INCLUDE_DIR})
  endif()
endif()
