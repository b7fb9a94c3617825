# Finds CUTLASS/CuTe headers and sets FLASHLAB_CUTLASS_INCLUDE.
#   1. -DCUTLASS_DIR=<dir> (a CUTLASS checkout or its include/ folder), or
#   2. cutlass/cutlass.h on the default include path, or
#   3. the nvidia-cutlass package of the Python that CMake finds (pip install . declares it
#      as a build requirement: tools/build_backend/flashlab_build.py), else that package's
#      wheel from PyPI (plain CMake builds). Either way the headers are used from one place
#      in the build tree, ${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass/cutlass_library/source/
#      include. No copy of CUTLASS lives in the repository.
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

  # The Python of the build: scikit-build-core passes Python3_EXECUTABLE, the interpreter of
  # pip's isolated build environment, where nvidia-cutlass was installed.
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  set(target "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass")
  set(dir "${target}/cutlass_library/source/include")
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
            "import cutlass_library, os, importlib.metadata as m; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include')); print(m.version('nvidia-cutlass'))"
    RESULT_VARIABLE rc OUTPUT_VARIABLE found OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0)
    string(REPLACE "\n" ";" found "${found}")
    list(GET found 0 found_dir)
    list(GET found 1 found_version)
  endif()
  if(rc EQUAL 0 AND EXISTS "${found_dir}/cute/tensor.hpp")
    # Copied into the build tree, once per version: pip deletes its build environment after
    # the build, and a rebuild in the same build folder then still sees the same headers at
    # the same path (no recompilation of every CuTe object), as does a compiler cache shared
    # with the plain CMake build (the same path relative to the build folder).
    set(stamp "${target}/nvidia-cutlass-version")
    if(EXISTS "${stamp}")
      file(READ "${stamp}" copied_version)
    endif()
    if(NOT copied_version STREQUAL found_version OR NOT EXISTS "${dir}/cute/tensor.hpp")
      message(STATUS "FlashLab: copying nvidia-cutlass ${found_version}'s headers from ${found_dir}")
      file(REMOVE_RECURSE "${dir}")
      file(COPY "${found_dir}/" DESTINATION "${dir}")
      file(WRITE "${stamp}" "${found_version}")
    endif()
    set(FLASHLAB_CUTLASS_INCLUDE "${dir}" CACHE PATH "CUTLASS include folder" FORCE)
    message(STATUS "FlashLab: CUTLASS headers at ${dir}")
    return()
  endif()
  # Else the nvidia-cutlass wheel from PyPI, downloaded by CMake itself and checked against
  # its SHA-256, its headers unpacked into the build tree. No pip: `pip install .` builds in
  # an isolated environment whose Python may have none.
  set(wheel "${CMAKE_BINARY_DIR}/_deps/nvidia_cutlass-${FLASHLAB_CUTLASS_VERSION}-py3-none-any.whl")
  message(STATUS "FlashLab: no CUTLASS found; downloading nvidia-cutlass ${FLASHLAB_CUTLASS_VERSION} into ${target}")
  file(DOWNLOAD "${FLASHLAB_CUTLASS_WHEEL_URL}" "${wheel}"
       EXPECTED_HASH SHA256=${FLASHLAB_CUTLASS_WHEEL_SHA256} TLS_VERIFY ON STATUS status)
  list(GET status 0 rc)
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
