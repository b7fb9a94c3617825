# nanobind stubgen patterns for flashlab._flashlab: the element types of the lists and dicts
# the bindings build by hand (nb::list, nb::dict), which stubgen writes without arguments.
# The stubs in python/flashlab/_flashlab/ are made with (from a build with the module):
#   python -m nanobind.stubgen -q -r -m flashlab._flashlab -p tools/stubs/_flashlab.pat \
#       -O python/flashlab
# and tests/python/test_package.py checks that they match the module.
flashlab\._flashlab\.kernels$:
    \from typing import Any
    def kernels() -> list[dict[str, Any]]: ...

flashlab\._flashlab\.bench\.Row\.errors$:
    @property
    def errors(self) -> dict[str, float]: ...

flashlab\._flashlab\.bench\.Bench\.describe$:
    def describe(self) -> dict[str, str]: ...
