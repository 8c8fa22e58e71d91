# What `cmake --install` puts under the prefix, and the Debian packages CPack builds from it.
#
#   bin/kvtier-server, bin/kvtierctl                              component server   -> kvtier-server.deb
#   <libdir>/libkvtier_client.so.0 (C++ client), libkvtier.so.0 (C API)  runtime    -> libkvtier0.deb
#   include/kvtier/{client,common}/*.h, include/kvtier/kvtier.h,
#   <libdir>/libkvtier_client.so, libkvtier.so, libkvtier_client.a,
#   <libdir>/cmake/kvtier/ (find_package(kvtier CONFIG)), <libdir>/pkgconfig/kvtier-client.pc, kvtier.pc
#                                                                  component dev      -> libkvtier-dev.deb
#
# Inside the tree kvtier_client is a static library over private static pieces (kvtier_ucx, kvtier_nccl,
# kvtier_common, kvtier_wire, kvtier_proto). The installed client is built from the objects of all six, once as a
# shared library and once as a static archive, so that a program links one kvtier library plus the
# system libraries. Its public headers include only absl, spdlog and each other.
#
# find_package(kvtier CONFIG) gives kvtier::client (shared) and kvtier::c (the C API, libkvtier.so),
# and, with COMPONENTS static, kvtier::client_static, which also needs gRPC, protobuf, UCX, c-ares,
# ZeroMQ, xxHash and OpenSSL (found by the config file). Include this file after every add_subdirectory().
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_kvtier_client_parts kvtier_client kvtier_ucx kvtier_nccl kvtier_common kvtier_wire kvtier_proto)

# Libraries the parts link (public and private), without the parts themselves: what the installed
# client needs from the system.
set(_kvtier_client_deps)
foreach(_part IN LISTS _kvtier_client_parts)
  get_target_property(_libs ${_part} LINK_LIBRARIES)
  foreach(_lib IN LISTS _libs)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" _lib "${_lib}")
    if(_lib STREQUAL "kvtier::nccl")  # found by cmake/Nccl.cmake, not exported: link the library itself
      set(_lib "${KVTIER_NCCL_LIBRARY}")
    endif()
    if(NOT _lib IN_LIST _kvtier_client_parts)
      list(APPEND _kvtier_client_deps ${_lib})
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _kvtier_client_deps)
# What the public headers (client_lib/include) include: a program using kvtier::client links these too.
set(_kvtier_client_header_deps absl::status absl::statusor absl::strings absl::time absl::hash
    absl::flat_hash_map absl::synchronization spdlog::spdlog)

set(_kvtier_client_objects)
foreach(_part IN LISTS _kvtier_client_parts)
  list(APPEND _kvtier_client_objects $<TARGET_OBJECTS:${_part}>)
endforeach()

add_library(kvtier_client_shared SHARED ${_kvtier_client_objects})
target_link_libraries(kvtier_client_shared PUBLIC ${_kvtier_client_header_deps} PRIVATE ${_kvtier_client_deps})
target_link_options(kvtier_client_shared PRIVATE "LINKER:--no-undefined")
set_target_properties(kvtier_client_shared PROPERTIES
  OUTPUT_NAME kvtier_client
  EXPORT_NAME client
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib)

add_library(kvtier_client_static STATIC ${_kvtier_client_objects})
target_link_libraries(kvtier_client_static PUBLIC ${_kvtier_client_header_deps} ${_kvtier_client_deps})
set_target_properties(kvtier_client_static PROPERTIES
  OUTPUT_NAME kvtier_client
  EXPORT_NAME client_static
  ARCHIVE_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib)

foreach(_t kvtier_client_shared kvtier_client_static)
  target_include_directories(${_t} INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/client_lib/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${_t} INTERFACE cxx_std_20)
endforeach()
set_target_properties(kvtier_c PROPERTIES EXPORT_NAME c)
target_include_directories(kvtier_c INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# The names an installed kvtier gives, for code built in this tree (examples/cpp_client, c_client).
add_library(kvtier::client ALIAS kvtier_client_shared)
add_library(kvtier::client_static ALIAS kvtier_client_static)
add_library(kvtier::c ALIAS kvtier_c)

# ---- install rules ----------------------------------------------------------------------------------
install(TARGETS kvtier-server kvtierctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT server)
install(TARGETS kvtier_client_shared kvtier_c EXPORT kvtierTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(TARGETS kvtier_client_static EXPORT kvtierStaticTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client_lib/include/kvtier/client ${PROJECT_SOURCE_DIR}/client_lib/include/kvtier/common
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvtier COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_SOURCE_DIR}/bindings/c/include/kvtier/kvtier.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvtier COMPONENT dev)

set(KVTIER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)
install(EXPORT kvtierTargets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT dev)
install(EXPORT kvtierStaticTargets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvtier-config.cmake.in
  ${PROJECT_BINARY_DIR}/package/kvtier-config.cmake INSTALL_DESTINATION ${KVTIER_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/kvtier-config-version.cmake
  COMPATIBILITY SameMinorVersion)  # 0.x: a minor release may change the API
install(FILES ${PROJECT_BINARY_DIR}/package/kvtier-config.cmake ${PROJECT_BINARY_DIR}/package/kvtier-config-version.cmake
  DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT dev)

# pkg-config: relocatable (${pcfiledir}), so the same files serve `cmake --install --prefix` and the .deb.
file(RELATIVE_PATH KVTIER_PC_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" KVTIER_PC_PREFIX "${KVTIER_PC_PREFIX}")
set(KVTIER_PC_LIBS_PRIVATE "")
if(KVTIER_CUDA_ENABLED)
  set(KVTIER_PC_LIBS_PRIVATE "-L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
if(KVTIER_NCCL_ENABLED)  # the client's NCCL path (kvtier_nccl)
  get_filename_component(_kvtier_nccl_dir "${KVTIER_NCCL_LIBRARY}" DIRECTORY)
  string(APPEND KVTIER_PC_LIBS_PRIVATE " -L${_kvtier_nccl_dir} -lnccl")
endif()
foreach(_pc kvtier kvtier-client)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${_pc}.pc.in ${PROJECT_BINARY_DIR}/package/${_pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/package/${_pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endforeach()

# ---- Debian packages (cpack -G DEB, from a tree configured with -DCMAKE_INSTALL_PREFIX=/usr) ----------
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VENDOR "kvtier")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Distributed KV-cache tier for LLM inference")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "kvtier maintainers <kvtier@localhost>")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL server runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # Depends from the ELF files (dpkg-shlibdeps)
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME kvtier-server)
set(CPACK_DEBIAN_SERVER_DESCRIPTION "kvtier cache server (kvtier-server) and admin CLI (kvtierctl)")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libkvtier${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "kvtier client libraries: C++ (libkvtier_client) and C API (libkvtier)")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libkvtier-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION "kvtier client headers, static library, CMake package and pkg-config files")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
# The headers need absl and spdlog; the static library (and pkg-config --static) the rest.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libkvtier${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION}), libabsl-dev, libspdlog-dev, libgrpc++-dev, libprotobuf-dev, libucx-dev, libc-ares-dev, libzmq3-dev, libxxhash-dev, libssl-dev, nlohmann-json3-dev, pkg-config")
include(CPack)
