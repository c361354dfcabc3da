"""Load the tensor file a dump record names: ``.npy`` (MindSpore dumpers) or ``.pt`` (msprobe PyTorch).

Files are data from other people's clusters: ``.npy`` is read with ``allow_pickle=False``,
``.pt`` with ``torch.load(weights_only=True)`` (tensors only, no code); the name must be a
plain file name inside the rank folder's ``dump_tensor_data``, and neither the file nor
that folder may be a symlink (the only way a plain name could lead outside the dump).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

import numpy as np


class TensorFileError(ValueError):
    """A tensor file is missing, outside the dump, or unreadable; the message names it, ``why`` says
    what is wrong without the path (for counting alike failures together)."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.why = why


def data_path(data_dir: str, record: Mapping[str, Any]) -> Optional[str]:
    """Path of the record's tensor file, or None when the record names none (statistics task)."""
    name = record.get("data_name")
    if not isinstance(name, str) or not name or name == "-1":
        return None
    if os.sep in name or (os.altsep and os.altsep in name) or name in (".", ".."):
        raise TensorFileError(f"data_name {name!r}", "is not a plain file name")
    path = os.path.join(data_dir, name)
    if os.path.islink(path) or os.path.islink(data_dir):  # a plain name can only leave through a link
        raise TensorFileError(path, f"is a symlink; tensor files must be plain files inside {data_dir}")
    return path


def load(path: str) -> np.ndarray:
    """The array in ``path``; bfloat16 and other torch-only dtypes come back as float32."""
    if not os.path.isfile(path):
        raise TensorFileError(path, "missing")
    try:
        if path.endswith(".pt"):
            return _load_pt(path)
        array = _load_npy(path)
    except TensorFileError:
        raise
    except (OSError, ValueError, EOFError) as err:
        raise TensorFileError(path, f"unreadable: {err}") from None
    if array.dtype.kind not in "biuf":
        raise TensorFileError(path, f"holds {array.dtype} values, not numbers")
    return array


# The header of a version 1-3 .npy file holding a plain array of numbers, as numpy writes it
# (numpy/lib/format.py: a dict literal with descr, fortran_order, shape).
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER = re.compile(
    r"^\{'descr': '([<>|=][biuf][0-9]+)', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \} *\n$"
)


def _load_npy(path: str) -> np.ndarray:
    """A .npy file of numbers, its header parsed by a regular expression (numpy's own parser evaluates
    it as a Python literal, the larger part of the time for small tensors); any other header goes to
    ``np.load(allow_pickle=False)``. Nothing is ever unpickled."""
    with open(path, "rb") as handle:
        prefix = handle.read(10)
        if len(prefix) == 10 and prefix[:6] == _NPY_MAGIC and prefix[6] == 1:
            size = int.from_bytes(prefix[8:10], "little")
            match = _NPY_HEADER.match(handle.read(size).decode("latin1"))
            if match:
                descr, fortran, dims = match.groups()
                shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
                count = int(np.prod(shape)) if shape else 1
                array = np.fromfile(handle, dtype=np.dtype(descr), count=count)
                if array.size != count:
                    raise ValueError(f"{count} values expected, {array.size} found")
                return array.reshape(shape, order="F" if fortran == "True" else "C")
    return np.load(path, allow_pickle=False)


def _load_pt(path: str) -> np.ndarray:
    try:
        import torch
    except ImportError:
        raise TensorFileError(path, "reading PyTorch .pt files needs torch installed") from None
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a bad file; all mean "unreadable"
        raise TensorFileError(path, f"unreadable: {type(err).__name__}: {err}") from None
    if not isinstance(value, torch.Tensor):
        raise TensorFileError(path, f"holds {type(value).__name__}, not a tensor")
    if value.dtype in (torch.bfloat16, torch.float16) or not value.dtype.is_floating_point:
        value = value.float() if value.dtype.is_floating_point else value
    return value.detach().cpu().numpy()
