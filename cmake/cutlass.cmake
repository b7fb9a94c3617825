# Finds CUTLASS/CuTe headers and sets FLASHLAB_CUTLASS_INCLUDE.
#   1. -DCUTLASS_DIR=<dir> (a CUTLASS checkout or its include/ folder), or
#   2. cutlass/cutlass.h on the default include path, or
#   3. the nvidia-cutlass package of the Python that CMake finds, else that package's wheel
#      from PyPI, unpacked into the build tree (${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass)
#      and used from its cutlass_library/source/include. No copy of CUTLASS lives in the
#      repository.
set(FLASHLAB_CUTLASS_VERSION "4.2.0.0")
set(FLASHLAB_CUTLASS_WHEEL_URL
    "https://files.pythonhosted.org/packages/21/6b/e86fc2fd536dd4b8bd2209aa31d7002610c501b0802337787eac9c9b328c/nvidia_cutlass-4.2.0.0-py3-none-any.whl")
set(FLASHLAB_CUTLASS_WHEEL_SHA256 f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6)
set(CUTLASS_DIR "" CACHE PATH "CUTLASS checkout or include folder")

function(flashlab_find_cutlass)
  if(FLASHLAB_CUTLASS_INCLUDE AND EXISTS "${FLASHLAB_CUTLASS_INCLUDE}/cute/tensor.hpp")
    return()
  endif()
  set(candidates)
  if(CUTLASS_DIR)
    list(APPEND candidates "${CUTLASS_DIR}/include" "${CUTLASS_DIR}")
  endif()
  list(APPEND candidates "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass/cutlass_library/source/include")
  foreach(dir IN LISTS candidates)
    if(EXISTS "${dir}/cute/tensor.hpp" AND EXISTS "${dir}/cutlass/cutlass.h")
      set(FLASHLAB_CUTLASS_INCLUDE "${dir}" CACHE PATH "CUTLASS include folder" FORCE)
      message(STATUS "FlashLab: CUTLASS headers at ${dir}")
      return()
    endif()
  endforeach()
  if(CUTLASS_DIR)
    message(FATAL_ERROR "CUTLASS_DIR=${CUTLASS_DIR} holds no cute/tensor.hpp")
  endif()
  find_path(_cutlass_sys cute/tensor.hpp)
  if(_cutlass_sys)
    set(FLASHLAB_CUTLASS_INCLUDE "${_cutlass_sys}" CACHE PATH "CUTLASS include folder" FORCE)
    message(STATUS "FlashLab: CUTLASS headers at ${_cutlass_sys}")
    return()
  endif()

  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  # An nvidia-cutlass already installed for this Python.
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
            "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    RESULT_VARIABLE rc OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND EXISTS "${dir}/cute/tensor.hpp")
    set(FLASHLAB_CUTLASS_INCLUDE "${dir}" CACHE PATH "CUTLASS include folder" FORCE)
    message(STATUS "FlashLab: CUTLASS headers at ${dir}")
    return()
  endif()
  # Else the nvidia-cutlass wheel from PyPI, downloaded by CMake itself and checked against
  # its SHA-256, its headers unpacked into the build tree. No pip: `pip install .` builds in
  # an isolated environment whose Python may have none.
  set(target "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass")
  set(wheel "${CMAKE_BINARY_DIR}/_deps/nvidia_cutlass-${FLASHLAB_CUTLASS_VERSION}-py3-none-any.whl")
  message(STATUS "FlashLab: no CUTLASS found; downloading nvidia-cutlass ${FLASHLAB_CUTLASS_VERSION} into ${target}")
  file(DOWNLOAD "${FLASHLAB_CUTLASS_WHEEL_URL}" "${wheel}"
       EXPECTED_HASH SHA256=${FLASHLAB_CUTLASS_WHEEL_SHA256} TLS_VERIFY ON STATUS status)
  list(GET status 0 rc)
  set(dir "${target}/cutlass_library/source/include")
  if(rc EQUAL 0)
    file(ARCHIVE_EXTRACT INPUT "${wheel}" DESTINATION "${target}"
         PATTERNS "cutlass_library/source/include/*")
  endif()
  if(NOT rc EQUAL 0 OR NOT EXISTS "${dir}/cute/tensor.hpp")
    message(FATAL_ERROR "Could not download nvidia-cutlass (${status}) from "
                        "${FLASHLAB_CUTLASS_WHEEL_URL}.\n"
                        "Pass -DCUTLASS_DIR=<cutlass checkout> or turn the CuTe targets off.")
  endif()
  set(FLASHLAB_CUTLASS_INCLUDE "${dir}" CACHE PATH "CUTLASS include folder" FORCE)
  message(STATUS "FlashLab: CUTLASS headers at ${dir}")
endfunction()
