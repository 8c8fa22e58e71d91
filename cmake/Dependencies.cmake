# Every third-party dependency, as Debian 12 packages it (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)           # CMake's FindProtobuf: Debian ships no protobuf-config.cmake
find_package(gRPC CONFIG REQUIRED)        # gRPC::grpc++, gRPC::grpc_cpp_plugin
find_package(absl CONFIG REQUIRED)
find_package(RocksDB CONFIG REQUIRED)
find_package(ucx CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)     # logging (kvtier/common/log.h), with Debian's fmt
find_package(nlohmann_json CONFIG REQUIRED)
# The civetweb prometheus-cpp's Exposer runs; the query endpoints hook into it (docs/query.md).
find_package(civetweb CONFIG REQUIRED)
find_package(OpenSSL REQUIRED)            # SHA-256 for fingerprints and ring positions
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(CARES REQUIRED IMPORTED_TARGET libcares)  # DNS membership with a configurable server
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)  # KV events: PUB socket (docs/events.md)
if(KVTIER_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
