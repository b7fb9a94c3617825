"""A DLPack producer that labels host memory with any device, so that the device rules of
validation (mixed devices, a device the package does not run on) are tested on machines
without a GPU. Every call made with one must fail validation: no kernel may touch it.
"""

from __future__ import annotations

import ctypes
from typing import Any, Tuple

import numpy as np

CPU, CUDA, VULKAN = 1, 2, 7  # DLDeviceType codes


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):  # no deleter: the Python object owns everything
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAME = b"dltensor"
_CODES = {"f": 2, "i": 0, "u": 1}  # kDLFloat, kDLInt, kDLUInt


class Labelled:
    """`array`'s memory exported through DLPack as if it lived on (device_type, device_id)."""

    def __init__(self, array: np.ndarray, device_type: int = CUDA, device_id: int = 0):
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        n = array.ndim
        self._shape = (ctypes.c_int64 * n)(*array.shape)
        self._strides = (ctypes.c_int64 * n)(*(s // array.itemsize for s in array.strides))
        self._device = (device_type, device_id)
        self._managed = _Managed(
            _Tensor(array.ctypes.data, _Device(device_type, device_id), n,
                    _DType(_CODES[array.dtype.kind], array.dtype.itemsize * 8, 1),
                    self._shape, self._strides, 0),
            None, None)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **_: Any) -> Any:
        return _capsule_new(ctypes.addressof(self._managed), _NAME, None)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self._device
