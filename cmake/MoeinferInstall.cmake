# Install rules: headers, library, CMake package (moeinfer::moeinfer) and pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS moeinfer EXPORT moeinferTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/moeinfer DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT moeinferTargets NAMESPACE moeinfer:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moeinfer)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moeinferConfig.cmake.in
  ${CMAKE_BINARY_DIR}/moeinferConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moeinfer)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/moeinferConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/moeinferConfig.cmake ${CMAKE_BINARY_DIR}/moeinferConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moeinfer)
set(MOEINFER_PC_LIBS_PRIVATE "-lpthread")
configure_file(${PROJECT_SOURCE_DIR}/cmake/moeinfer.pc.in ${CMAKE_BINARY_DIR}/moeinfer.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/moeinfer.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(MOEINFER_BUILD_EXAMPLES)
  install(TARGETS moeinfer-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
