# install(): the library, its headers and a CMake package exporting gpupool::gpupool.
include(CMakePackageConfigHelpers)

set(GPUPOOL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gpupool)
install(TARGETS gpupool EXPORT gpupoolTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/gpupool DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/gpupool/version.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gpupool)
install(EXPORT gpupoolTargets NAMESPACE gpupool:: DESTINATION ${GPUPOOL_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gpupoolConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gpupoolConfig.cmake INSTALL_DESTINATION ${GPUPOOL_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gpupoolConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gpupoolConfig.cmake ${PROJECT_BINARY_DIR}/gpupoolConfigVersion.cmake
  DESTINATION ${GPUPOOL_CMAKE_DIR})
if(GPUPOOL_BUILD_TOOLS)
  install(TARGETS gpupool_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
