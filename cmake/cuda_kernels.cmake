# The CUDA sources of the library: the runtime helpers, one file per ladder rung, and the
# CuTe kernels' dispatch plus one generated file per instantiation
# (scripts/gen_sm80_instantiations.py writes those). Folders are globbed: a new kernel's files
# need no line here, only its entry in src/kernel_list.h.
file(GLOB FLASHLAB_CUDA_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/*.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/*.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/*.cu)

# The head dims of FLASHLAB_HEAD_DIMS, checked, and the mask the dispatch files read
# (src/cuda/head_dims.h: bit i for 64, 96, 128, 192, 256).
set(_flashlab_all_head_dims 64 96 128 192 256)
set(FLASHLAB_HEAD_DIMS_MASK 0)
foreach(hdim IN LISTS FLASHLAB_HEAD_DIMS)
  list(FIND _flashlab_all_head_dims "${hdim}" _i)
  if(_i LESS 0)
    message(FATAL_ERROR "FLASHLAB_HEAD_DIMS: ${hdim} is not one of 64;96;128;192;256")
  endif()
  math(EXPR FLASHLAB_HEAD_DIMS_MASK "${FLASHLAB_HEAD_DIMS_MASK} | (1 << ${_i})")
endforeach()
if(FLASHLAB_HEAD_DIMS_MASK EQUAL 0)
  message(FATAL_ERROR "FLASHLAB_HEAD_DIMS is empty: name at least one of 64;96;128;192;256")
endif()
if(NOT FLASHLAB_HEAD_DIMS_MASK EQUAL 31)
  message(STATUS "FlashLab: CuTe kernels for head dims ${FLASHLAB_HEAD_DIMS} only")
endif()

# The CuTe FlashAttention-2 forward and backward (sm80 path): one .cu per (pass, head dim,
# dtype), for the head dims of FLASHLAB_HEAD_DIMS.
file(GLOB _flashlab_sm80_instantiations CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/instantiations/*.cu)
set(FLASHLAB_CUTE_SOURCES "")
foreach(src IN LISTS _flashlab_sm80_instantiations)
  string(REGEX MATCH "_hdim([0-9]+)_" _m "${src}")
  if(CMAKE_MATCH_1 IN_LIST FLASHLAB_HEAD_DIMS)
    list(APPEND FLASHLAB_CUTE_SOURCES "${src}")
  endif()
endforeach()
list(APPEND FLASHLAB_CUDA_SOURCES ${FLASHLAB_CUTE_SOURCES})
# Only the dispatch files read the mask (and tests/CMakeLists.txt passes it to two GPU
# tests), so that no other object's command line (or compiler cache entry) depends on it.
set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/dispatch.cu APPEND PROPERTY
  COMPILE_DEFINITIONS FLASHLAB_HEAD_DIMS_MASK=${FLASHLAB_HEAD_DIMS_MASK})

# Only the CuTe sources see the CUTLASS headers (cmake/cutlass.cmake finds or fetches them).
include(${CMAKE_CURRENT_LIST_DIR}/cutlass.cmake)
flashlab_find_cutlass()
set_source_files_properties(${FLASHLAB_CUTE_SOURCES} PROPERTIES
  INCLUDE_DIRECTORIES "${FLASHLAB_CUTLASS_INCLUDE}")

# The Hopper forward (cute_fa3): sm_90a only, when 90a is in FLASHLAB_CUDA_ARCHS.
include(${CMAKE_CURRENT_LIST_DIR}/sm90_kernels.cmake)
