# Race checking of the GPU backend's kernels on the host emulation (simt_racecheck.h):
# zaya_simt_racecheck_tests is zaya_simt_gpu_tests with every src/backend/cuda/*.cu compiled with
# -fsanitize=thread and ZAYA_SIMT_RACECHECK, so ThreadSanitizer reports two GPU threads that touch
# the same bytes without a barrier, a warp-wide instruction or a kernel boundary between them, one
# of them writing: within a block, and between consecutive blocks of a launch (which the
# emulation runs one after another, and the hardware at once). The emulation's scheduler, the
# runtime API, zaya_lib (the CPU backend the tests compare with) and the tests themselves are not
# instrumented. Included by tests/simt/CMakeLists.txt in builds without the sanitizers or a real
# GPU backend, with ZAYA_RACECHECK_BACKEND_SOURCES (the kernels' own copies of the generated
# wrappers, so that their flags are their own) and ZAYA_SIMT_GPU_TESTS set.

# One thread for the CPU backend the tests compare with (its OpenMP and OpenBLAS threads are not
# instrumented), and the first race fails the test.
set(ZAYA_RACECHECK_ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "TSAN_OPTIONS=halt_on_error=1 exitcode=66")

# zaya_simt_racecheck(<suffix> <warp size>): the instrumented kernels, the emulation and
# zaya_simt_racecheck<suffix>_tests for warps of <warp size> lanes.
function(zaya_simt_racecheck suffix warp)
  set(defs ZAYA_SIMT ZAYA_SIMT_WARP_SIZE=${warp} ZAYA_HAVE_NCCL ZAYA_SIMT_RACECHECK)
  # The kernels, instrumented.
  set(kernels zaya_simt_racecheck${suffix}_kernels)
  add_library(${kernels} OBJECT ${ZAYA_RACECHECK_BACKEND_SOURCES})
  target_compile_definitions(${kernels} PRIVATE ${defs})
  target_include_directories(${kernels} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(${kernels} PRIVATE zaya_lib)  # its include directories and flags
  zaya_apply_flags(${kernels})
  target_compile_options(${kernels} PRIVATE -Wno-unknown-pragmas -Wno-unused-parameter -fsanitize=thread -g1)
  zaya_unity_build(${kernels})

  # The emulation itself, not instrumented: it tells the sanitizer what runs and what orders what.
  # (The runtime alone, and the emulated NCCL and backend registration, which need the kernels.)
  set(runtime zaya_simt_racecheck${suffix}_runtime)
  set(register zaya_simt_racecheck${suffix}_register)
  add_library(${runtime} OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/simt_runtime.cpp
              ${CMAKE_CURRENT_SOURCE_DIR}/simt_fiber_context.cpp ${CMAKE_CURRENT_SOURCE_DIR}/simt_host_api.cpp
              ${CMAKE_CURRENT_SOURCE_DIR}/simt_racecheck.cpp)
  add_library(${register} OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/simt_nccl.cpp
              ${CMAKE_CURRENT_SOURCE_DIR}/simt_register.cpp)
  foreach(lib ${runtime} ${register})
    target_compile_definitions(${lib} PRIVATE ${defs})
    target_include_directories(${lib} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(${lib} PRIVATE zaya_lib)
    zaya_apply_flags(${lib})
    target_compile_options(${lib} PRIVATE -Wno-unknown-pragmas -Wno-unused-parameter)
  endforeach()

  set(exe zaya_simt_racecheck${suffix}_tests)
  add_executable(${exe} ${ZAYA_SIMT_GPU_TESTS} ${CMAKE_CURRENT_SOURCE_DIR}/simt_leak_check.cpp
                 $<TARGET_OBJECTS:${kernels}> $<TARGET_OBJECTS:${runtime}> $<TARGET_OBJECTS:${register}>)
  target_compile_definitions(${exe} PRIVATE ${defs} ZAYA_SIMT_SMALL
    ZAYA_SOURCE_DIR="${CMAKE_SOURCE_DIR}" ZAYA_BINARY_DIR="${CMAKE_BINARY_DIR}")
  target_include_directories(${exe} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src
                             ${CMAKE_SOURCE_DIR}/tests/unit ${CMAKE_SOURCE_DIR}/tests/gpu)
  target_link_libraries(${exe} PRIVATE zaya_lib GTest::gtest GTest::gtest_main)
  target_link_options(${exe} PRIVATE -fsanitize=thread)
  zaya_apply_flags(${exe})
  target_compile_options(${exe} PRIVATE -Wno-unknown-pragmas)
  zaya_unity_build(${exe})
endfunction()

# 32-lane warps, as CUDA builds the kernels (the tensor-core ones included), and 64-lane ones, as
# hipcc builds them for CDNA: there a block holds half as many warps, the warp reductions and
# the per-warp shared arrays take their 64-lane form, and no GPU of ours runs them.
zaya_simt_racecheck("" 32)
zaya_simt_racecheck("_wave64" 64)

# The race checking itself, on kernels with a race and without (racecheck_seeded.cpp): each racy
# case passes only when ThreadSanitizer reports a data race, each race-free one only when it
# reports nothing and the kernel ran. At both warp sizes (racecheck_finds.*, racecheck_passes.*;
# racecheck_wave64_finds.*, ...), the cp.async prefetch cases at 32 lanes only (no HIP kernel has
# them).
function(zaya_simt_racecheck_seeded suffix warp)
  set(exe zaya_simt_racecheck${suffix}_seeded)
  add_executable(${exe} ${CMAKE_CURRENT_SOURCE_DIR}/racecheck_seeded.cpp
                 $<TARGET_OBJECTS:zaya_simt_racecheck${suffix}_runtime>)
  target_compile_definitions(${exe} PRIVATE ZAYA_SIMT ZAYA_SIMT_WARP_SIZE=${warp} ZAYA_HAVE_NCCL
                             ZAYA_SIMT_RACECHECK)
  target_include_directories(${exe} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(${exe} PRIVATE zaya_lib)
  zaya_apply_flags(${exe})
  target_compile_options(${exe} PRIVATE -fsanitize=thread -g1 -Wno-unknown-pragmas)
  target_link_options(${exe} PRIVATE -fsanitize=thread)
  set(racy shared_without_barrier dynamic_without_barrier blocks_add_plainly block_reads_the_next)
  set(clean shared_with_barrier dynamic_with_barrier blocks_add_atomically launch_reads_the_previous warp_sums)
  if(warp EQUAL 32)
    list(APPEND racy prefetch_over_unread_tile)
    list(APPEND clean prefetch_after_barrier)
  endif()
  foreach(case ${racy})
    add_test(NAME racecheck${suffix}_finds.${case} COMMAND ${exe} ${case})
    set_tests_properties(racecheck${suffix}_finds.${case} PROPERTIES ENVIRONMENT "${ZAYA_RACECHECK_ENV}" TIMEOUT 60
                         PASS_REGULAR_EXPRESSION "WARNING: ThreadSanitizer: data race")
  endforeach()
  foreach(case ${clean})
    add_test(NAME racecheck${suffix}_passes.${case} COMMAND ${exe} ${case})
    set_tests_properties(racecheck${suffix}_passes.${case} PROPERTIES ENVIRONMENT "${ZAYA_RACECHECK_ENV}"
                         TIMEOUT 60 PASS_REGULAR_EXPRESSION "ran ${case}"
                         FAIL_REGULAR_EXPRESSION "ThreadSanitizer")
  endforeach()
endfunction()
zaya_simt_racecheck_seeded("" 32)
zaya_simt_racecheck_seeded("_wave64" 64)

# The backend's tests under the race checking, as racecheck.*: all but the communicator's (MPI),
# the training runs, four model-level cases whose kernels the others run too (the recomputation
# step, the decisive-routing and long-chunk gradients, the fp32 LM head beside the bf16 one) and
# the flash backward's precision check (GpuCca.Attention runs its kernels).
# Their times summed to 602 s in a `make test` run (ctest -j2), GpuCca.Attention 102 s of it (its
# cases of 200 or more queries are left to the other builds).
gtest_discover_tests(zaya_simt_racecheck_tests DISCOVERY_TIMEOUT 60 TEST_PREFIX "racecheck."
  TEST_FILTER "-GpuTraining*:GpuTrainer*:GpuComm*:GpuModel.ActivationRecompute*:*LmHeadLoss/tiled_fp32:GpuModelGradsBf16.*:GpuModelGradsLongChunks.*:GpuCca.FlashBackward*"
  PROPERTIES TIMEOUT 900 ENVIRONMENT "${ZAYA_RACECHECK_ENV}")
# The same at 64 lanes, as racecheck_wave64.*: the op tests, where a kernel's warp count, warp
# reductions and per-warp shared arrays take the HIP build's form. Left out: the model-level cases
# (they run the same kernels again), the TF32 slices (HIP has no TF32), the device-grouped MoE on
# the tensor cores (at 64 lanes it is the portable kernel, bf16_tiled_grouped) and the fp32 modes
# of the MoE and LM head (their 32-lane race checking and 64-lane value tests stay). Their times
# summed to 361 s in a `make test` run (ctest -j2; a first run of every op test found no race).
gtest_discover_tests(zaya_simt_racecheck_wave64_tests DISCOVERY_TIMEOUT 60 TEST_PREFIX "racecheck_wave64."
  TEST_FILTER "-GpuTraining*:GpuTrainer*:GpuComm*:*GpuModel*:*GpuDecode*:GpuCca.FlashBackward*:GpuFactory.*:GpuLmHead.Tf32x3*:*/bf16_grouped:*GpuMoe*/tiled_fp32:*LmHeadLoss/tiled_fp32"
  PROPERTIES TIMEOUT 900 ENVIRONMENT "${ZAYA_RACECHECK_ENV}")
