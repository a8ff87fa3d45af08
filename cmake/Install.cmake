# Install rules: headers, the library, a CMake package (find_package(kvtier) gives
# kvtier::kvtier) and kvtier.pc for pkg-config, which is also generated in the build tree.
include(CMakePackageConfigHelpers)

install(TARGETS kvtier EXPORT kvtierTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT kvtierTargets NAMESPACE kvtier::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)
configure_package_config_file(cmake/kvtierConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kvtierConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kvtierConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvtierConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/kvtierConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)

# Build-tree kvtier.pc points at the source headers and the build directory, with absolute
# paths, so that bindings can use pkg-config without installing, wherever the build tree is.
set(KVT_PC_LIBDIR ${CMAKE_CURRENT_BINARY_DIR}/src)
set(KVT_PC_INCLUDEDIR ${CMAKE_CURRENT_SOURCE_DIR}/include)
configure_file(cmake/kvtier.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kvtier.pc @ONLY)
# The installed one names the prefix it is installed to (`cmake --install --prefix` included,
# DESTDIR not), so it is written at install time, out of sight of PKG_CONFIG_PATH=<build>.
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(kvt_pc_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(kvt_pc_${kind} "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
set(kvt_pc_installed ${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/kvtier-installed.pc)
install(CODE "
  set(KVT_PC_LIBDIR \"${kvt_pc_LIBDIR}\")
  set(KVT_PC_INCLUDEDIR \"${kvt_pc_INCLUDEDIR}\")
  set(PROJECT_DESCRIPTION \"${PROJECT_DESCRIPTION}\")
  set(PROJECT_VERSION \"${PROJECT_VERSION}\")
  configure_file(\"${CMAKE_CURRENT_SOURCE_DIR}/cmake/kvtier.pc.in\" \"${kvt_pc_installed}\" @ONLY)
")
install(FILES ${kvt_pc_installed} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig RENAME kvtier.pc)
