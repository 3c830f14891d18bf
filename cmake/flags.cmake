# Compiler flags shared by every zaya target: warnings, ISA level, sanitizers.
function(zaya_apply_flags target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  # zaya never reads or traps floating-point exception flags. Without this GCC keeps a float
  # comparison that selects a value as a branch, and no loop with one vectorises (the CPU
  # backend's exp_vectorisable, src/backend/cpu/vector_math.h); clang's default already.
  target_compile_options(${target} PRIVATE -fno-trapping-math)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    # GCC 12 reports std::string concatenation inlined at -O2/-O3 as overlapping memcpy
    # (-Wrestrict, GCC bug 105329, fixed in 13): noise in every optimised build, not our code.
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  if(ZAYA_NATIVE)
    target_compile_options(${target} PRIVATE -march=x86-64-v3)
  endif()
  if(CMAKE_BUILD_TYPE STREQUAL "Release")
    target_compile_options(${target} PRIVATE -O3)
  endif()
  if(ZAYA_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# Unity builds: CMake compiles a target's sources in batches of 8 files, one translation unit
# each, so the headers every file includes (nlohmann::json, GoogleTest, CLI11, the standard
# library) are parsed, and their templates instantiated and optimised, once per batch instead
# of once per file. Most of a zaya file's compile time is those headers (test_serve.cpp: 6.5 of
# its 8.2 s is the front end), and CI builds everything twice (normal and sanitizers): batched,
# the unit tests took 247 CPU-s instead of 421 and the CLI 56 instead of 205. Used by the
# library, the CLI, the unit tests and the emulated GPU tests (not by the emulated kernels,
# whose files share helper names). A batch is one translation unit, so the file-local helpers
# of a target's files need distinct names (two of one name clash or, worse, overload each
# other), and a using-directive at file scope reaches the batch's later files (the library has
# none).
# Every file must still compile alone: -DZAYA_UNITY=OFF builds that way, and so does CI's HIP
# build of the library, the CLI and the GPU tests (scripts/hip_build_check.sh), where a file
# that leans on a batch neighbour's #include or helper fails.
option(ZAYA_UNITY "Compile each target's sources in batches (unity build)" ON)
function(zaya_unity_build target)
  if(ZAYA_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    # A batch #includes its .cpp files, so GCC takes them for headers and warns that a test
    # fixture's class (TEST_F derives from it) lives in an anonymous namespace: true of every
    # file-local fixture, and harmless within one translation unit.
    target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
  endif()
endfunction()
