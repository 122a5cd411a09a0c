# What `cmake --install` puts under the prefix, and what `cpack -G DEB` packs:
#   include/troupe/*.h (+ the generated config.h)      the public API
#   lib/libtroupe.a, lib/libtroupe.so.*                 the library, static and shared
#   lib/cmake/troupe/                                   find_package(troupe): troupe::troupe (shared);
#                                                       troupe::troupe_static with COMPONENTS static
#   lib/pkgconfig/troupe.pc                             pkg-config --cflags --libs [--static] troupe
#   bin/troupe                                          the command line
# The shared library needs nothing more at build time. The static one needs the third-party
# libraries troupe is built on, with their -dev packages: troupeConfig.cmake finds them only when
# asked for the static component, and troupe.pc names them in Libs.private.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(libtroupe PROPERTIES EXPORT_NAME troupe_static)
set_target_properties(libtroupe_shared PROPERTIES EXPORT_NAME troupe)
# Installed, the static library's users link what its objects need.
set(TROUPE_STATIC_DEPS
    DNNL::dnnl OpenMP::OpenMP_CXX PkgConfig::LMDB leveldb::leveldb protobuf::libprotobuf
    PkgConfig::TURBOJPEG PkgConfig::JPEG PkgConfig::PNG ZLIB::ZLIB PkgConfig::HIREDIS CapnProto::capnp
    CapnProto::kj OpenSSL::Crypto tomlplusplus::tomlplusplus spdlog::spdlog fmt::fmt
    Threads::Threads)
target_link_libraries(libtroupe INTERFACE $<INSTALL_INTERFACE:${TROUPE_STATIC_DEPS}>)

install(TARGETS libtroupe_shared troupe_cli EXPORT troupeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS libtroupe EXPORT troupeStaticTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/troupe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/troupe/config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe)
install(EXPORT troupeTargets NAMESPACE troupe::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
install(EXPORT troupeStaticTargets NAMESPACE troupe::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/troupeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/troupeConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake
              ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
configure_file(${PROJECT_SOURCE_DIR}/cmake/troupe.pc.in ${PROJECT_BINARY_DIR}/troupe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/troupe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# cpack -G DEB (from the build folder): a package that depends on the Debian libraries the
# binaries load, as dpkg-shlibdeps finds them.
set(CPACK_PACKAGE_NAME troupe)
set(CPACK_PACKAGE_VENDOR "troupe")
set(CPACK_PACKAGE_CONTACT "troupe maintainers <troupe@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Distributed deep-learning trainer: actors over Asio and Cap'n Proto, KVStore schedules")
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# What linking libtroupe.a (find_package(troupe COMPONENTS static)) takes besides.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS
    "libdnnl-dev, liblmdb-dev, libleveldb-dev, libprotobuf-dev, libturbojpeg0-dev, libjpeg62-turbo-dev, libpng-dev, \
zlib1g-dev, libhiredis-dev, capnproto, libcapnp-dev, libssl-dev, libtomlplusplus-dev, \
libspdlog-dev, libfmt-dev")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
