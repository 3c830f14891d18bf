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
