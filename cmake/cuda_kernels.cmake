# The CUDA sources of the library: the runtime helpers, one file per ladder rung, and the
# CuTe kernels' dispatch plus one generated file per instantiation
# (scripts/gen_sm80_instantiations.py writes those). Folders are globbed: a new kernel's files
# need no line here, only its entry in src/kernel_list.h.
file(GLOB FLASHLAB_CUDA_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/*.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/*.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/*.cu)

# The CuTe FlashAttention-2 forward and backward (sm80 path): one .cu per (pass, head dim,
# dtype).
file(GLOB FLASHLAB_CUTE_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/instantiations/*.cu)
list(APPEND FLASHLAB_CUDA_SOURCES ${FLASHLAB_CUTE_SOURCES})

# Only the CuTe sources see the CUTLASS headers (cmake/cutlass.cmake finds or fetches them).
include(${CMAKE_CURRENT_LIST_DIR}/cutlass.cmake)
flashlab_find_cutlass()
set_source_files_properties(${FLASHLAB_CUTE_SOURCES} PROPERTIES
  INCLUDE_DIRECTORIES "${FLASHLAB_CUTLASS_INCLUDE}")

# The Hopper forward (cute_fa3): sm_90a only, when 90a is in FLASHLAB_CUDA_ARCHS.
include(${CMAKE_CURRENT_LIST_DIR}/sm90_kernels.cmake)
