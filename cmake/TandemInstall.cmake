# `cmake --install`: headers, libtandem, the `tandem` CLI, and a CMake package
# (tandemConfig.cmake, tandemConfigVersion.cmake, tandemTargets.cmake) under
# <prefix>/lib/cmake/tandem. tests/install/ builds a consumer against it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TANDEM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/tandem")

# Installed programs find libtandem next door and LibTorch where it was
# built against (LibTorch's link directories also name MKL paths that do not
# exist, so the link path is not copied wholesale).
set_target_properties(tandem tandem_cli PROPERTIES
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR};${TANDEM_TORCH_LIBDIR}")

install(TARGETS tandem EXPORT tandemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS tandem_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tandem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tandemTargets NAMESPACE tandem:: DESTINATION ${TANDEM_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tandemConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/tandemConfig.cmake
  INSTALL_DESTINATION ${TANDEM_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_BINDIR)
# 0.x: a minor release may break the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tandemConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tandemConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/tandemConfigVersion.cmake
        DESTINATION ${TANDEM_INSTALL_CMAKEDIR})
