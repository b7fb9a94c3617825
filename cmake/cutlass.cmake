# Finds CUTLASS/CuTe headers and sets FLASHLAB_CUTLASS_INCLUDE.
#   1. -DCUTLASS_DIR=<dir> (a CUTLASS checkout or its include/ folder), or
#   2. cutlass/cutlass.h on the default include path, or
#   3. the nvidia-cutlass package of the Python that CMake finds, else that package from
#      PyPI, installed into the build tree
#      (${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass) and used from its
#      cutlass_library/source/include. No copy of CUTLASS lives in the repository.
set(FLASHLAB_CUTLASS_VERSION "4.2.0.0" CACHE STRING "nvidia-cutlass version fetched from PyPI when no CUTLASS is found")
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
  set(target "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass")
  message(STATUS "FlashLab: no CUTLASS found; installing nvidia-cutlass==${FLASHLAB_CUTLASS_VERSION} into ${target}")
  # This Python's pip, else any pip on the PATH (pip install . builds in an isolated
  # environment whose Python may have no pip module).
  set(pip ${Python3_EXECUTABLE} -m pip)
  execute_process(COMMAND ${pip} --version RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    find_program(FLASHLAB_PIP NAMES pip3 pip)
    if(FLASHLAB_PIP)
      set(pip ${FLASHLAB_PIP})
    endif()
  endif()
  execute_process(
    COMMAND ${pip} install --quiet --disable-pip-version-check --no-deps
            --target "${target}" "nvidia-cutlass==${FLASHLAB_CUTLASS_VERSION}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(dir "${target}/cutlass_library/source/include")
  if(NOT rc EQUAL 0 OR NOT EXISTS "${dir}/cute/tensor.hpp")
    message(FATAL_ERROR "Could not install nvidia-cutlass (${rc}): ${err}\n"
                        "Pass -DCUTLASS_DIR=<cutlass checkout> or turn the CuTe targets off.")
  endif()
  set(FLASHLAB_CUTLASS_INCLUDE "${dir}" CACHE PATH "CUTLASS include folder" FORCE)
  message(STATUS "FlashLab: CUTLASS headers at ${dir}")
endfunction()
