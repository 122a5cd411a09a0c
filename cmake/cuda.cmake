# Finds nvcc, the CUDA toolkit, cuDNN and NCCL; sets TROUPE_CUDA_BUILT to 1 when all are there and
# defines troupe_cuda_plugin(), which adds libtroupe_cuda.so (kernels/cuda/, kernels/cuda_plugin.h).
# Included from the top CMakeLists.txt unless TROUPE_USE_CUDA is OFF.

include(CheckLanguage)
include(GNUInstallDirs)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
set(troupe_cuda_missing "")
if(CMAKE_CUDA_COMPILER)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND troupe_cuda_missing "the CUDA toolkit")
  endif()
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  foreach(v CUDNN_INCLUDE_DIR CUDNN_LIBRARY NCCL_INCLUDE_DIR NCCL_LIBRARY)
    if(NOT ${v})
      list(APPEND troupe_cuda_missing ${v})
    endif()
  endforeach()
else()
  list(APPEND troupe_cuda_missing "nvcc")
endif()

if(troupe_cuda_missing)
  if(TROUPE_USE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TROUPE_USE_CUDA=ON, but not found: ${troupe_cuda_missing}")
  endif()
  message(STATUS "troupe: no CUDA backend (not found: ${troupe_cuda_missing})")
  return()
endif()
set(TROUPE_CUDA_BUILT 1)
message(STATUS "troupe: CUDA backend for sm_${CMAKE_CUDA_ARCHITECTURES} (nvcc "
               "${CMAKE_CUDA_COMPILER_VERSION}, ${CUDNN_LIBRARY}, ${NCCL_LIBRARY})")
if(CCACHE_PROGRAM)
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

function(troupe_cuda_plugin)
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cc
       ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
  # The plugin carries the few troupe sources it needs, so it loads into any troupe binary.
  add_library(troupe_cuda SHARED ${srcs} ${PROJECT_SOURCE_DIR}/kernels/tensor.cc
                                 ${PROJECT_SOURCE_DIR}/kernels/geometry.cc
                                 ${PROJECT_SOURCE_DIR}/kernels/update.cc)
  target_include_directories(troupe_cuda PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                                                 ${PROJECT_BINARY_DIR}/include ${CUDNN_INCLUDE_DIR}
                                                 ${NCCL_INCLUDE_DIR})
  target_link_libraries(troupe_cuda PRIVATE CUDA::cudart_static CUDA::cublas ${CUDNN_LIBRARY}
                                            ${NCCL_LIBRARY})
  list(JOIN CMAKE_CUDA_ARCHITECTURES ";sm_" archs)
  target_compile_definitions(troupe_cuda PRIVATE TROUPE_CUDA_ARCHITECTURES="sm_${archs}")
  target_compile_options(troupe_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr
                                             -Xcompiler=-Wall,-Wextra>)
  # build/lib beside build/bin and build/tests: the loader looks in ../lib of the running binary.
  # CMake 3.25 knows no CUDA20; the .cu files need C++17 only.
  set_target_properties(troupe_cuda PROPERTIES CUDA_STANDARD 17 LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib
                                               BUILD_RPATH "${CUDAToolkit_LIBRARY_DIR}")
  # Tests and the CLI load it at run time; building them builds it.
  add_dependencies(troupe_kernels troupe_cuda)
  # Installed only when asked for (cmake --install BUILD --component cuda), into the library folder
  # beside bin/, where an installed troupe looks: the Debian package keeps its Debian-only
  # dependencies (cuDNN and NCCL are not Debian's), and the plugin finds them where it was built.
  set_target_properties(troupe_cuda PROPERTIES INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
  install(TARGETS troupe_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT cuda
          EXCLUDE_FROM_ALL)
endfunction()
