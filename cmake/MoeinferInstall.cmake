# Install rules: headers, libraries (shared + static), CMake package (moeinfer::moeinfer,
# moeinfer::moeinfer_static) and pkg-config files (moeinfer.pc, moeinfer-static.pc).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(MOEINFER_INSTALL_TARGETS moeinfer)
if(TARGET moeinfer_static)
  list(APPEND MOEINFER_INSTALL_TARGETS moeinfer_static)
endif()
install(TARGETS ${MOEINFER_INSTALL_TARGETS} EXPORT moeinferTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/moeinfer DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT moeinferTargets NAMESPACE moeinfer:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moeinfer)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moeinferConfig.cmake.in
  ${CMAKE_BINARY_DIR}/moeinferConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moeinfer)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/moeinferConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/moeinferConfig.cmake ${CMAKE_BINARY_DIR}/moeinferConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moeinfer)

# pkg-config: moeinfer.pc links the default library (shared when built shared);
# moeinfer-static.pc names libmoeinfer.a explicitly (a plain -lmoeinfer would pick the .so).
# Relocatable: prefix is derived from the .pc file's own location, so `cmake --install
# --prefix DIR` into any directory yields a working file.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(MOEINFER_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _rel "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
  set(MOEINFER_PC_PREFIX "\${pcfiledir}/${_rel}")
endif()
# What a static libmoeinfer.a needs at link time. cudart is linked statically: into the shared
# library (whose .pc therefore names none of these) or, for the archive, as cudart_static.
set(MOEINFER_PC_DEPS "-lpthread -lstdc++ -lm")
if(MOEINFER_HAVE_CUDA)
  get_filename_component(_cudart_dir "${CUDA_cudart_static_LIBRARY}" DIRECTORY)
  set(MOEINFER_PC_DEPS "-L${_cudart_dir} -lcudart_static -lrt -ldl ${MOEINFER_PC_DEPS}")
endif()
set(MOEINFER_PC_NAME "moeinfer")
if(BUILD_SHARED_LIBS)
  set(MOEINFER_PC_LIBS "-L\${libdir} -lmoeinfer")
  set(MOEINFER_PC_LIBS_PRIVATE "")
else()  # libmoeinfer.a only: its dependencies in Libs, so a plain --libs links
  set(MOEINFER_PC_LIBS "-L\${libdir} -lmoeinfer ${MOEINFER_PC_DEPS}")
  set(MOEINFER_PC_LIBS_PRIVATE "")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/moeinfer.pc.in ${CMAKE_BINARY_DIR}/moeinfer.pc @ONLY)
set(MOEINFER_PC_FILES ${CMAKE_BINARY_DIR}/moeinfer.pc)
if(TARGET moeinfer_static OR NOT BUILD_SHARED_LIBS)
  # Names libmoeinfer.a itself (a plain -lmoeinfer would pick the .so) and its dependencies,
  # so a plain `pkg-config --libs moeinfer-static` links.
  set(MOEINFER_PC_NAME "moeinfer-static")
  set(MOEINFER_PC_LIBS "\${libdir}/libmoeinfer.a ${MOEINFER_PC_DEPS}")
  set(MOEINFER_PC_LIBS_PRIVATE "")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/moeinfer.pc.in ${CMAKE_BINARY_DIR}/moeinfer-static.pc @ONLY)
  list(APPEND MOEINFER_PC_FILES ${CMAKE_BINARY_DIR}/moeinfer-static.pc)
endif()
install(FILES ${MOEINFER_PC_FILES} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

if(MOEINFER_BUILD_EXAMPLES AND TARGET moeinfer-cli)
  install(TARGETS moeinfer-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
