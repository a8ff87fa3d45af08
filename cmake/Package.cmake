# `cpack -G DEB` in a build tree makes kvtier_<version>_<arch>.deb: what `cmake --install`
# installs (the library, its header, kvtier.pc, the CMake package and the tools), under /usr,
# stripped, depending on the Debian packages of the libraries it links (dpkg-shlibdeps; a CUDA
# build also needs NVIDIA's runtime, which no Debian package provides).
# tools/test-packages.sh installs it with apt in a fresh root and builds the examples on it.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VENDOR kvtier)
set(CPACK_PACKAGE_CONTACT "kvtier developers <kvtier@users.noreply.github.com>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_STRIP_FILES ON)  # the debug info stays in the build tree
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
include(CPack)
