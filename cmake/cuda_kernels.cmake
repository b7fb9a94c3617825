# The CUDA sources of the library: one file per rung (and later, one per instantiation).
set(FLASHLAB_CUDA_SOURCES
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/runtime.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/registry.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/01_naive.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/02_fa1.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/03_fa2_simt.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/04_fa2_mma.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/ladder/05_fa2_simt_bwd.cu
)
