# cmake -DBUILD=<flashlab build> -DPREFIX=<dir> -P install.cmake: installs the build into an
# emptied PREFIX.
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD}" --prefix "${PREFIX}"
  COMMAND_ERROR_IS_FATAL ANY)
