"""The one statistics function: counts and extremes agree with plain numpy, whole or in chunks."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mf_celldump.statistics import STATISTICS, StatsAccumulator, compute_statistics

FLOATS = arrays(np.float32, st.integers(1, 64),
                elements=st.one_of(st.floats(-1e3, 1e3, width=32), st.just(np.nan), st.just(np.inf),
                                   st.just(-np.inf)))


def _same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=200, deadline=None)
@given(FLOATS, st.integers(1, 16))
def test_nan_and_inf_counts_and_extremes_match_numpy_in_any_chunking(array, chunk):
    expected = {"nan_count": int(np.isnan(array).sum()), "inf_count": int(np.isinf(array).sum()),
                "Max": array.max().item(), "Min": array.min().item()}
    whole = compute_statistics(array, STATISTICS)
    accumulator = StatsAccumulator(array.dtype, STATISTICS)
    for start in range(0, array.size, chunk):
        accumulator.add(array[start:start + chunk])
    for record in (whole, accumulator.result()):
        assert record["nan_count"] == expected["nan_count"]
        assert record["inf_count"] == expected["inf_count"]
        assert _same(record["Max"], expected["Max"]) and _same(record["Min"], expected["Min"])


def test_counts_alone_are_computed_without_the_extremes_being_reported():
    array = np.array([1.0, np.inf, np.nan, 2.0], np.float16)
    assert compute_statistics(array, ("nan_count", "inf_count")) == {"nan_count": 1, "inf_count": 1}
    assert compute_statistics(np.arange(4, dtype=np.int8), ("nan_count",)) == {"nan_count": 0}
