"""Dtype names: numpy-style (raw file names) to MindSpore's spelling (dump.json)."""

from __future__ import annotations

import functools
from typing import Optional

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


# Spellings other dumpers use for the same dtype (PyTorch's, C's, short forms).
_DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp16": "float16",
    "fp64": "float64",
    "long": "int64",
    "int": "int32",
    "bool_": "bool",
}


def canonical_dtype(dtype: Optional[str]) -> str:
    """``Float32``, ``torch.float32``, ``float32`` -> ``float32``."""
    return _canonical(dtype if isinstance(dtype, str) else str(dtype or ""))


@functools.lru_cache(maxsize=1024)  # a comparison asks about the same few spellings for every tensor
def _canonical(text: str) -> str:
    text = text.strip().lower()
    text = text.rpartition(".")[2]
    return _DTYPE_ALIASES.get(text, text)
