# The GPU backend (src/backend/cuda/*.cu). Both options are OFF by default, and then nothing
# here compiles anything: the normal CPU build is unchanged.
#   -DZAYA_CUDA=ON  builds the .cu files with nvcc for CMAKE_CUDA_ARCHITECTURES (default 80;90)
#                   into zaya_lib (compile definition ZAYA_CUDA, so make_backend("cuda") works),
#                   linked with cuBLASLt, plus the GPU tests in tests/gpu. The NCCL communicator
#                   (every comm_nccl*.cu) is built and libnccl linked when NCCL is found (next to
#                   the CUDA toolkit, or under ZAYA_NCCL_ROOT); zaya_lib then has ZAYA_HAVE_NCCL.
#   -DZAYA_HIP=ON   compiles the same .cu files with hipcc for ZAYA_HIP_ARCH (default gfx90a)
#                   (target zaya_hip_objects) and, when the HIP runtime (libamdhip64) is found,
#                   links them into zaya_lib as ZAYA_CUDA does: zaya, the tests and the GPU tests
#                   for AMD GPUs (the GPU backend keeps its name, "cuda"). comm_nccl*.cu only
#                   when RCCL is found (ZAYA_HAVE_RCCL; Debian has no RCCL).
# Included from the top-level CMakeLists.txt before zaya_lib exists, so the links into
# zaya_lib and the tests are deferred to the end of the top-level directory.
option(ZAYA_CUDA "Build the CUDA backend (needs nvcc and cuBLASLt)" OFF)
option(ZAYA_HIP "Build the GPU backend with hipcc for AMD GPUs" OFF)
set(ZAYA_HIP_ARCH "gfx90a" CACHE STRING "AMD offload architecture for ZAYA_HIP")

set(ZAYA_NCCL_ROOT "" CACHE PATH "Where NCCL is installed when it is not next to the CUDA toolkit")
file(GLOB ZAYA_GPU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu)
file(GLOB ZAYA_GPU_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.h)
# The NCCL/RCCL communicator (the communicator, its watchdog, its arrival channel): every
# comm_nccl*.cu, compiled only where its collective library is found.
file(GLOB ZAYA_GPU_COMM_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/comm_nccl*.cu)

if(ZAYA_CUDA AND ZAYA_HIP)
  message(FATAL_ERROR "ZAYA_CUDA and ZAYA_HIP build the same sources for different GPUs: choose one")
endif()

# Run at the end of the top-level directory, once zaya_lib holds the GPU backend (CUDA or HIP):
# make_backend("cuda") is then linked in (ZAYA_CUDA), and the GPU tests are added.
function(zaya_gpu_backend_linked)
  target_compile_definitions(zaya_lib PUBLIC ZAYA_CUDA)
  if(ZAYA_BUILD_TESTS)
    # include(), not add_subdirectory(): subdirectories cannot be added in deferred calls.
    include(${CMAKE_SOURCE_DIR}/tests/gpu/CMakeLists.txt)
  endif()
endfunction()

if(ZAYA_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80;90")
  endif()
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 does not know nvcc 13's C++20 flag; zaya is C++20 throughout, so the CUDA
  # dialect follows CMAKE_CXX_STANDARD and needs the flag spelled out.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()

  # NCCL: the communicator of multi-GPU data parallelism (src/backend/cuda/comm_nccl*.cu).
  find_path(ZAYA_NCCL_INCLUDE nccl.h HINTS ${ZAYA_NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(ZAYA_NCCL_LIBRARY nccl HINTS ${ZAYA_NCCL_ROOT}/lib ${ZAYA_NCCL_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
  set(ZAYA_CUDA_SOURCES ${ZAYA_GPU_SOURCES})
  if(ZAYA_NCCL_INCLUDE AND ZAYA_NCCL_LIBRARY)
    message(STATUS "zaya CUDA: NCCL communicator on (${ZAYA_NCCL_LIBRARY})")
  else()
    list(REMOVE_ITEM ZAYA_CUDA_SOURCES ${ZAYA_GPU_COMM_SOURCES})
    message(STATUS "zaya CUDA: NCCL not found (nccl.h / libnccl; set ZAYA_NCCL_ROOT): the NCCL communicator "
                   "(comm_nccl*.cu) is left out")
  endif()

  add_library(zaya_cuda OBJECT ${ZAYA_CUDA_SOURCES})
  target_include_directories(zaya_cuda PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(zaya_cuda PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
  set_target_properties(zaya_cuda PROPERTIES CUDA_RUNTIME_LIBRARY Shared POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(zaya_cuda PUBLIC CUDA::cudart CUDA::cublasLt)
  if(ZAYA_NCCL_INCLUDE AND ZAYA_NCCL_LIBRARY)
    target_include_directories(zaya_cuda PRIVATE ${ZAYA_NCCL_INCLUDE})
    target_link_libraries(zaya_cuda PUBLIC ${ZAYA_NCCL_LIBRARY})
    # PUBLIC: zaya_lib (and so the tests) see ZAYA_HAVE_NCCL, i.e. make_nccl_comm is linked in.
    target_compile_definitions(zaya_cuda PUBLIC ZAYA_HAVE_NCCL)
  endif()

  function(zaya_cuda_attach)
    # The objects of zaya_cuda become part of zaya_lib; its usage requirements (cudart,
    # cublasLt) propagate to everything that links zaya_lib.
    target_link_libraries(zaya_lib PUBLIC zaya_cuda)
    zaya_gpu_backend_linked()
  endfunction()
  cmake_language(DEFER CALL zaya_cuda_attach)
endif()

if(ZAYA_HIP)
  find_program(ZAYA_HIPCC hipcc REQUIRED)
  # hipBLASLt when installed (ROCm >= 6; Debian 12 has none): the BLASLt GEMM path, else our
  # tiled GEMM kernel.
  find_path(ZAYA_HIPBLASLT_INCLUDE hipblaslt/hipblaslt.h PATHS /opt/rocm/include)
  # RCCL (NCCL's API for AMD GPUs): <rccl/rccl.h> from ROCm 5, <rccl.h> before. Debian has none.
  find_path(ZAYA_RCCL_INCLUDE NAMES rccl/rccl.h rccl.h PATHS /opt/rocm/include)
  set(ZAYA_HIP_DEFS -DZAYA_HIP)
  if(ZAYA_HIPBLASLT_INCLUDE)
    list(APPEND ZAYA_HIP_DEFS -DZAYA_HAVE_HIPBLASLT -I${ZAYA_HIPBLASLT_INCLUDE})
  endif()
  if(ZAYA_HIPBLASLT_INCLUDE)
    message(STATUS "zaya HIP: ${ZAYA_HIP_ARCH}, GEMM: hipBLASLt")
  else()
    message(STATUS "zaya HIP: ${ZAYA_HIP_ARCH}, GEMM: tiled kernel (no hipBLASLt found)")
  endif()
  set(ZAYA_HIP_SOURCES ${ZAYA_GPU_SOURCES})
  if(ZAYA_RCCL_INCLUDE)
    list(APPEND ZAYA_HIP_DEFS -DZAYA_HAVE_RCCL -I${ZAYA_RCCL_INCLUDE})
    message(STATUS "zaya HIP: RCCL communicator on (${ZAYA_RCCL_INCLUDE})")
  else()
    list(REMOVE_ITEM ZAYA_HIP_SOURCES ${ZAYA_GPU_COMM_SOURCES})
    message(STATUS "zaya HIP: no RCCL found (rccl/rccl.h or rccl.h under /opt/rocm/include): the RCCL "
                   "communicator (comm_nccl*.cu) is left out")
  endif()
  set(ZAYA_HIP_OBJECTS)
  foreach(src ${ZAYA_HIP_SOURCES})
    get_filename_component(name ${src} NAME_WE)
    set(obj ${CMAKE_BINARY_DIR}/hip/${name}.o)
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/hip
      COMMAND ${ZAYA_HIPCC} --offload-arch=${ZAYA_HIP_ARCH} -std=c++20 -O2 -Wall -Wextra -Wno-unused-parameter
              ${ZAYA_HIP_DEFS} -I${CMAKE_SOURCE_DIR}/src -x hip -c ${src} -o ${obj}
      DEPENDS ${src} ${ZAYA_GPU_HEADERS} ${CMAKE_SOURCE_DIR}/src/backend/backend.h
      COMMENT "hipcc ${ZAYA_HIP_ARCH}: ${name}.cu"
      VERBATIM)
    list(APPEND ZAYA_HIP_OBJECTS ${obj})
  endforeach()
  add_custom_target(zaya_hip_objects ALL DEPENDS ${ZAYA_HIP_OBJECTS})

  # The linked build: the objects join zaya_lib with the HIP runtime, so make_backend("cuda")
  # is the HIP backend and the GPU tests build (they skip without a device).
  find_library(ZAYA_AMDHIP64 amdhip64 PATHS /opt/rocm/lib)
  if(ZAYA_AMDHIP64)
    message(STATUS "zaya HIP: linked into zaya_lib (${ZAYA_AMDHIP64})")
    function(zaya_hip_attach)
      set_source_files_properties(${ZAYA_HIP_OBJECTS} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
      target_sources(zaya_lib PRIVATE ${ZAYA_HIP_OBJECTS})
      add_dependencies(zaya_lib zaya_hip_objects)
      target_link_libraries(zaya_lib PUBLIC ${ZAYA_AMDHIP64})
      zaya_gpu_backend_linked()
    endfunction()
    cmake_language(DEFER CALL zaya_hip_attach)
  else()
    message(STATUS "zaya HIP: no HIP runtime (libamdhip64) found: objects only, nothing linked")
  endif()
endif()
