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

# Build-tree kvtier.pc points at the source headers and the build directory, so bindings
# can use pkg-config without installing; the installed one points at the prefix.
set(KVT_PC_LIBDIR ${CMAKE_CURRENT_BINARY_DIR}/src)
set(KVT_PC_INCLUDEDIR ${CMAKE_CURRENT_SOURCE_DIR}/include)
configure_file(cmake/kvtier.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kvtier.pc @ONLY)
# Relative to the .pc file itself, so that `cmake --install --prefix` anywhere works.
file(RELATIVE_PATH kvt_pc_up /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" kvt_pc_up "${kvt_pc_up}")
set(KVT_PC_LIBDIR "\${pcfiledir}/${kvt_pc_up}/${CMAKE_INSTALL_LIBDIR}")
set(KVT_PC_INCLUDEDIR "\${pcfiledir}/${kvt_pc_up}/${CMAKE_INSTALL_INCLUDEDIR}")
configure_file(cmake/kvtier.pc.in ${CMAKE_CURRENT_BINARY_DIR}/install/kvtier.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/install/kvtier.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
