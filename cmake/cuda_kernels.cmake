# The CUDA sources of the library: one file per rung, and one per instantiation of the
# CuTe kernels (scripts/gen_sm80_instantiations.py writes those).
set(FLASHLAB_CUDA_SOURCES
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/runtime.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/registry.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/01_naive.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/02_fa1.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/03_fa2_simt.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/04_fa2_mma.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/05_fa2_simt_bwd.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/fwd_dispatch.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/bwd_dispatch.cu
)

# The CuTe FlashAttention-2 forward (sm80 path): one .cu per (head dim, dtype).
set(FLASHLAB_SM80_FWD_HEAD_DIMS 64 96 128 192 256)
set(FLASHLAB_CUTE_SOURCES)
foreach(hdim IN LISTS FLASHLAB_SM80_FWD_HEAD_DIMS)
  foreach(dtype fp16 bf16)
    list(APPEND FLASHLAB_CUTE_SOURCES
      ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/instantiations/fwd_hdim${hdim}_${dtype}.cu)
  endforeach()
endforeach()
# Its backward: one .cu per (head dim, dtype) as well.
set(FLASHLAB_SM80_BWD_HEAD_DIMS 64 96 128 192 256)
foreach(hdim IN LISTS FLASHLAB_SM80_BWD_HEAD_DIMS)
  foreach(dtype fp16 bf16)
    list(APPEND FLASHLAB_CUTE_SOURCES
      ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm80/instantiations/bwd_hdim${hdim}_${dtype}.cu)
  endforeach()
endforeach()
list(APPEND FLASHLAB_CUDA_SOURCES ${FLASHLAB_CUTE_SOURCES})

# Only the CuTe sources see the CUTLASS headers (cmake/cutlass.cmake finds or fetches them).
include(${CMAKE_CURRENT_LIST_DIR}/cutlass.cmake)
flashlab_find_cutlass()
set_source_files_properties(${FLASHLAB_CUTE_SOURCES} PROPERTIES
  INCLUDE_DIRECTORIES "${FLASHLAB_CUTLASS_INCLUDE}")

# The Hopper forward (cute_fa3): sm_90a only, when 90a is in FLASHLAB_CUDA_ARCHS.
include(${CMAKE_CURRENT_LIST_DIR}/sm90_kernels.cmake)
