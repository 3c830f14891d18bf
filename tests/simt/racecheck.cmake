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

set(ZAYA_RACECHECK_DEFINITIONS ZAYA_SIMT ZAYA_SIMT_WARP_SIZE=32 ZAYA_HAVE_NCCL ZAYA_SIMT_RACECHECK)
# One thread for the CPU backend the tests compare with (its OpenMP and OpenBLAS threads are not
# instrumented), and the first race fails the test.
set(ZAYA_RACECHECK_ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "TSAN_OPTIONS=halt_on_error=1 exitcode=66")

# The kernels, instrumented.
add_library(zaya_simt_racecheck_kernels OBJECT ${ZAYA_RACECHECK_BACKEND_SOURCES})
target_compile_definitions(zaya_simt_racecheck_kernels PRIVATE ${ZAYA_RACECHECK_DEFINITIONS})
target_include_directories(zaya_simt_racecheck_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(zaya_simt_racecheck_kernels PRIVATE zaya_lib)  # its include directories and flags
zaya_apply_flags(zaya_simt_racecheck_kernels)
target_compile_options(zaya_simt_racecheck_kernels PRIVATE -Wno-unknown-pragmas -Wno-unused-parameter
                       -fsanitize=thread -g1)
zaya_unity_build(zaya_simt_racecheck_kernels)

# The emulation itself, not instrumented: it tells the sanitizer what runs and what orders what.
# (The runtime alone, and the emulated NCCL and backend registration, which need the kernels.)
add_library(zaya_simt_racecheck_runtime OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/simt_runtime.cpp
            ${CMAKE_CURRENT_SOURCE_DIR}/simt_fiber_context.cpp ${CMAKE_CURRENT_SOURCE_DIR}/simt_host_api.cpp
            ${CMAKE_CURRENT_SOURCE_DIR}/simt_racecheck.cpp)
add_library(zaya_simt_racecheck_register OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/simt_nccl.cpp
            ${CMAKE_CURRENT_SOURCE_DIR}/simt_register.cpp)
foreach(lib zaya_simt_racecheck_runtime zaya_simt_racecheck_register)
  target_compile_definitions(${lib} PRIVATE ${ZAYA_RACECHECK_DEFINITIONS})
  target_include_directories(${lib} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(${lib} PRIVATE zaya_lib)
  zaya_apply_flags(${lib})
  target_compile_options(${lib} PRIVATE -Wno-unknown-pragmas -Wno-unused-parameter)
endforeach()

add_executable(zaya_simt_racecheck_tests ${ZAYA_SIMT_GPU_TESTS} ${CMAKE_CURRENT_SOURCE_DIR}/simt_leak_check.cpp
               $<TARGET_OBJECTS:zaya_simt_racecheck_kernels> $<TARGET_OBJECTS:zaya_simt_racecheck_runtime>
               $<TARGET_OBJECTS:zaya_simt_racecheck_register>)
target_compile_definitions(zaya_simt_racecheck_tests PRIVATE ${ZAYA_RACECHECK_DEFINITIONS} ZAYA_SIMT_SMALL
  ZAYA_SOURCE_DIR="${CMAKE_SOURCE_DIR}" ZAYA_BINARY_DIR="${CMAKE_BINARY_DIR}")
target_include_directories(zaya_simt_racecheck_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src
                           ${CMAKE_SOURCE_DIR}/tests/unit ${CMAKE_SOURCE_DIR}/tests/gpu)
target_link_libraries(zaya_simt_racecheck_tests PRIVATE zaya_lib GTest::gtest GTest::gtest_main)
target_link_options(zaya_simt_racecheck_tests PRIVATE -fsanitize=thread)
zaya_apply_flags(zaya_simt_racecheck_tests)
target_compile_options(zaya_simt_racecheck_tests PRIVATE -Wno-unknown-pragmas)
zaya_unity_build(zaya_simt_racecheck_tests)

# The race checking itself, on kernels with a race and without (racecheck_seeded.cpp): each racy
# case passes only when ThreadSanitizer reports a data race, each race-free one only when it
# reports nothing and the kernel ran.
add_executable(zaya_simt_racecheck_seeded ${CMAKE_CURRENT_SOURCE_DIR}/racecheck_seeded.cpp
               $<TARGET_OBJECTS:zaya_simt_racecheck_runtime>)
target_compile_definitions(zaya_simt_racecheck_seeded PRIVATE ${ZAYA_RACECHECK_DEFINITIONS})
target_include_directories(zaya_simt_racecheck_seeded PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(zaya_simt_racecheck_seeded PRIVATE zaya_lib)
zaya_apply_flags(zaya_simt_racecheck_seeded)
target_compile_options(zaya_simt_racecheck_seeded PRIVATE -fsanitize=thread -g1 -Wno-unknown-pragmas)
target_link_options(zaya_simt_racecheck_seeded PRIVATE -fsanitize=thread)
foreach(racy shared_without_barrier dynamic_without_barrier blocks_add_plainly block_reads_the_next
           prefetch_over_unread_tile)
  add_test(NAME racecheck_finds.${racy} COMMAND zaya_simt_racecheck_seeded ${racy})
  set_tests_properties(racecheck_finds.${racy} PROPERTIES ENVIRONMENT "${ZAYA_RACECHECK_ENV}" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "WARNING: ThreadSanitizer: data race")
endforeach()
foreach(clean shared_with_barrier dynamic_with_barrier blocks_add_atomically launch_reads_the_previous warp_sums
            prefetch_after_barrier)
  add_test(NAME racecheck_passes.${clean} COMMAND zaya_simt_racecheck_seeded ${clean})
  set_tests_properties(racecheck_passes.${clean} PROPERTIES ENVIRONMENT "${ZAYA_RACECHECK_ENV}" TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "ran ${clean}" FAIL_REGULAR_EXPRESSION "ThreadSanitizer")
endforeach()

# The backend's tests under the race checking, as racecheck.*: all but the communicator's (MPI),
# the training runs, four model-level cases whose kernels the others run too (the recomputation
# step, the decisive-routing and long-chunk gradients, the fp32 LM head beside the bf16 one) and
# the flash backward's precision check (GpuCca.Attention runs its kernels).
# Their times summed to 602 s in a `make test` run (ctest -j2), GpuCca.Attention 102 s of it (its
# cases of 200 or more queries are left to the other builds).
gtest_discover_tests(zaya_simt_racecheck_tests DISCOVERY_TIMEOUT 60 TEST_PREFIX "racecheck."
  TEST_FILTER "-GpuTraining*:GpuTrainer*:GpuComm*:GpuModel.ActivationRecompute*:*LmHeadLoss/tiled_fp32:GpuModelGradsBf16.*:GpuModelGradsLongChunks.*:GpuCca.FlashBackward*"
  PROPERTIES TIMEOUT 900 ENVIRONMENT "${ZAYA_RACECHECK_ENV}")
