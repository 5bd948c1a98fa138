# Finds NCCL and defines the IMPORTED target packpipe::nccl. Hints: NCCL_HOME, the CUDA toolkit.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_HOME} $ENV{NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS ${NCCL_HOME} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL DEFAULT_MSG NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET packpipe::nccl)
  add_library(packpipe::nccl UNKNOWN IMPORTED)
  set_target_properties(packpipe::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
