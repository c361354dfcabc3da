"""Dtype names: numpy-style (raw file names) to MindSpore's spelling (dump.json)."""

from __future__ import annotations

_NUMPY_TO_MINDSPORE = {
    "float16": "Float16",
    "float32": "Float32",
    "float64": "Float64",
    "bfloat16": "BFloat16",
    "int8": "Int8",
    "int16": "Int16",
    "int32": "Int32",
    "int64": "Int64",
    "uint8": "UInt8",
    "uint16": "UInt16",
    "uint32": "UInt32",
    "uint64": "UInt64",
    "bool": "Bool",
    "bool_": "Bool",
    "complex64": "Complex64",
    "complex128": "Complex128",
}
_MINDSPORE_TO_NUMPY = {v: k for k, v in _NUMPY_TO_MINDSPORE.items() if k != "bool_"}


def mindspore_dtype_name(numpy_name: str) -> str:
    """``float32`` -> ``Float32``; an unknown name is returned capitalised, never dropped."""
    return _NUMPY_TO_MINDSPORE.get(numpy_name.lower(), numpy_name[:1].upper() + numpy_name[1:])


def numpy_dtype_name(mindspore_name: str) -> str:
    return _MINDSPORE_TO_NUMPY.get(mindspore_name, mindspore_name.lower())


def dtype_names():
    """Numpy-style names with a known MindSpore spelling, in a fixed order (for codes)."""
    return tuple(k for k in _NUMPY_TO_MINDSPORE if k != "bool_")
