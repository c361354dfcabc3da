"""A stand-in for ``ops.TensorDump`` in PyNative that names files as Ascend does.

It writes the file at once, adding ``_in`` in "in" mode as TensorDump does on Ascend (on
CPU the real op ignores the mode), so tests can see the in/out modes of a layer mapping.
"""

import numpy as np


class AscendNamedTensorDump:
    counter = [0]

    def __init__(self, input_output="out"):
        self.mode = input_output

    def __call__(self, path, x):
        suffix = "_in" if self.mode == "in" else ""
        array = x.asnumpy()
        np.save(f"{path}{suffix}_{array.dtype.name}_{self.counter[0]}.npy", array)
        self.counter[0] += 1
