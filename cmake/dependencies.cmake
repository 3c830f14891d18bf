# Finds the Debian-packaged libraries zaya links (installed by scripts/setup.sh) and
# bundles them into one interface target, zaya_deps.
find_package(OpenMP REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(tomlplusplus 3 REQUIRED)  # training recipes (src/train/recipe.cpp)
find_package(PkgConfig REQUIRED)

# Any CBLAS works; OpenBLAS is the default. -DBLA_VENDOR=... picks another.
if(NOT DEFINED BLA_VENDOR)
  set(BLA_VENDOR OpenBLAS)
endif()
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/openblas /usr/include)

pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# Compressed corpus inputs for `zaya data prepare` (.gz, .zst): zlib1g-dev, libzstd-dev.
find_package(ZLIB REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
find_package(spdlog REQUIRED)
# Multi-process data parallelism (src/dist/comm_mpi.cpp): libopenmpi-dev, openmpi-bin for mpirun.
find_package(MPI REQUIRED COMPONENTS CXX)
# The HTTP inference server (src/serve/http_server.cpp): libcpp-httplib-dev. Debian ships it as a
# compiled library built with OpenSSL, zlib and Brotli support; its pkg-config flags carry the
# matching CPPHTTPLIB_* defines, which change httplib's class layouts, so they must be used.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

add_library(zaya_deps INTERFACE)
target_include_directories(zaya_deps INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(zaya_deps INTERFACE
  OpenMP::OpenMP_CXX Threads::Threads nlohmann_json::nlohmann_json
  ${BLAS_LIBRARIES} PkgConfig::SENTENCEPIECE spdlog::spdlog tomlplusplus::tomlplusplus
  ZLIB::ZLIB PkgConfig::ZSTD MPI::MPI_CXX PkgConfig::HTTPLIB)
