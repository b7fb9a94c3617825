# The Hopper forward (cute_fa3): built only when 90a is in FLASHLAB_CUDA_ARCHS, and then for
# sm_90a alone (wgmma and setmaxnreg exist on no other target), so its sources live in an
# object library with their own -gencode rather than the flashlab target's list of archs.
# Included at the end of cmake/cuda_kernels.cmake (after flashlab_find_cutlass()).
#
# scripts/gen_sm90_instantiations.py writes instantiations/: one .cu per (head dim, dtype).
# cute_fa3's head dims are 64, 128 and 256, those of FLASHLAB_HEAD_DIMS.
set(FLASHLAB_SM90_FWD_HEAD_DIMS "")
foreach(hdim 64 128 256)
  if(hdim IN_LIST FLASHLAB_HEAD_DIMS)
    list(APPEND FLASHLAB_SM90_FWD_HEAD_DIMS ${hdim})
  endif()
endforeach()
if("90a" IN_LIST FLASHLAB_CUDA_ARCHS AND NOT FLASHLAB_SM90_FWD_HEAD_DIMS)
  message(STATUS "FlashLab: cute_fa3 not built (FLASHLAB_HEAD_DIMS has none of 64, 128, 256)")
endif()
if(FLASHLAB_ABLATIONS AND NOT 128 IN_LIST FLASHLAB_HEAD_DIMS)
  message(FATAL_ERROR "FLASHLAB_ABLATIONS needs head dim 128 in FLASHLAB_HEAD_DIMS")
endif()
if("90a" IN_LIST FLASHLAB_CUDA_ARCHS AND FLASHLAB_SM90_FWD_HEAD_DIMS)
  set(FLASHLAB_SM90_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/fwd_dispatch.cu)
  foreach(hdim IN LISTS FLASHLAB_SM90_FWD_HEAD_DIMS)
    foreach(dtype fp16 bf16)
      list(APPEND FLASHLAB_SM90_SOURCES
        ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/instantiations/fwd_hdim${hdim}_${dtype}.cu)
    endforeach()
  endforeach()

  # The backward (cute_fa3's backward pass): instances at head dims 64, 96, 128, 192 and 256, those
  # of FLASHLAB_HEAD_DIMS.
  set(_bwd_dims "")
  foreach(hdim 64 96 128 192 256)
    if(hdim IN_LIST FLASHLAB_HEAD_DIMS)
      list(APPEND _bwd_dims ${hdim})
      foreach(dtype fp16 bf16)
        list(APPEND FLASHLAB_SM90_SOURCES
          ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/instantiations/bwd_hdim${hdim}_${dtype}.cu)
      endforeach()
    endif()
  endforeach()
  if(_bwd_dims)
    list(APPEND FLASHLAB_SM90_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/bwd_dispatch.cu)
    set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/fwd_dispatch.cu APPEND PROPERTY
      COMPILE_DEFINITIONS FLASHLAB_SM90_BWD=1)
  endif()

  # The schedule ablations (cute_fa3_no_pingpong, _no_overlap, _serial, _persistent):
  # bf16 head dim 128, built and registered (ablations.cu) only with FLASHLAB_ABLATIONS.
  if(FLASHLAB_ABLATIONS)
    list(APPEND FLASHLAB_SM90_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/ablations.cu)
    foreach(schedule no_pingpong no_overlap serial persistent)
      list(APPEND FLASHLAB_SM90_SOURCES
        ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/instantiations/fwd_hdim128_bf16_${schedule}.cu)
    endforeach()
  endif()

  set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/fwd_dispatch.cu
    ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/sm90/bwd_dispatch.cu APPEND PROPERTY
    COMPILE_DEFINITIONS FLASHLAB_HEAD_DIMS_MASK=${FLASHLAB_HEAD_DIMS_MASK})
  add_library(flashlab_sm90 OBJECT ${FLASHLAB_SM90_SOURCES})
  target_include_directories(flashlab_sm90 PRIVATE
    ${CMAKE_CURRENT_SOURCE_DIR}/include
    ${CMAKE_CURRENT_SOURCE_DIR}/src
    ${FLASHLAB_CUTLASS_INCLUDE})
  target_compile_definitions(flashlab_sm90 PRIVATE FLASHLAB_WITH_CUDA=1)
  target_compile_options(flashlab_sm90 PRIVATE
    -gencode=arch=compute_90a,code=sm_90a -O3 --expt-relaxed-constexpr -lineinfo
    -Xptxas=-warn-spills)
  set_target_properties(flashlab_sm90 PROPERTIES POSITION_INDEPENDENT_CODE ON)

  list(APPEND FLASHLAB_CUDA_SOURCES $<TARGET_OBJECTS:flashlab_sm90>)
  # src/kernel_list.h registers cute_fa3 (and its ablations) only in builds that have them:
  # a property of src/registry.cpp alone, so that no other object's command line, or
  # compiler cache entry, changes.
  set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/src/registry.cpp APPEND PROPERTY
    COMPILE_DEFINITIONS FLASHLAB_WITH_SM90=1 FLASHLAB_ABLATIONS=$<BOOL:${FLASHLAB_ABLATIONS}>)
endif()
