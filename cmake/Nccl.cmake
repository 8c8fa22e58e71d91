# Optional NCCL, auto-detected (include after Cuda.cmake). KVTIER_WITH_NCCL: AUTO (default) links NCCL
# when CUDA is enabled and nccl.h and libnccl are found (the CUDA toolkit's include/ and lib64/ or lib/,
# $NCCL_HOME, or the system), ON requires them (a FATAL_ERROR without CUDA or NCCL), OFF never looks.
# Sets KVTIER_NCCL_ENABLED and, when ON, the imported target kvtier::nccl.
set(KVTIER_WITH_NCCL AUTO CACHE STRING "AUTO|ON|OFF")
set_property(CACHE KVTIER_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)
set(KVTIER_NCCL_ENABLED OFF)
if(NOT KVTIER_WITH_NCCL STREQUAL "OFF")
  if(NOT KVTIER_CUDA_ENABLED)
    if(KVTIER_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "KVTIER_WITH_NCCL=ON needs CUDA (KVTIER_WITH_CUDA is ${KVTIER_WITH_CUDA}, no nvcc used)")
    endif()
  else()
    set(_kvtier_cuda_root "")
    if(CUDAToolkit_LIBRARY_ROOT)
      set(_kvtier_cuda_root "${CUDAToolkit_LIBRARY_ROOT}")
    endif()
    find_path(KVTIER_NCCL_INCLUDE_DIR nccl.h
      HINTS ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS} ${_kvtier_cuda_root}
      PATH_SUFFIXES include
      PATHS /usr/local/cuda /usr)
    find_library(KVTIER_NCCL_LIBRARY NAMES nccl
      HINTS ENV NCCL_HOME ${CUDAToolkit_LIBRARY_DIR} ${_kvtier_cuda_root}
      PATH_SUFFIXES lib64 lib
      PATHS /usr/local/cuda /usr)
    if(KVTIER_NCCL_INCLUDE_DIR AND KVTIER_NCCL_LIBRARY)
      add_library(kvtier::nccl SHARED IMPORTED)
      set_target_properties(kvtier::nccl PROPERTIES
        IMPORTED_LOCATION "${KVTIER_NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${KVTIER_NCCL_INCLUDE_DIR}")
      set(KVTIER_NCCL_ENABLED ON)
    elseif(KVTIER_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "KVTIER_WITH_NCCL=ON but nccl.h or libnccl was not found (set NCCL_HOME)")
    endif()
  endif()
endif()
message(STATUS "kvtier: NCCL ${KVTIER_NCCL_ENABLED} ${KVTIER_NCCL_LIBRARY}")
