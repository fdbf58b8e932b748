"""Streamed order statistics (order_stats.py) against numpy on known data."""

from __future__ import annotations

import numpy as np

from amp_convert.order_stats import LargestValues


def test_order_statistics_are_numpys_within_the_budget_and_bounded_past_it():
    """Chunks of errors over eight decades, fed as samples are: each
    quantile and the median equal numpy's bit for bit while the values
    they need are kept; past that the histogram's interval holds numpy's
    value and is at most ~2**-11 wide, and without one it is still a bound."""
    rng = np.random.default_rng(5)
    chunks = [np.abs(rng.standard_normal(int(rng.integers(1, 4000)))) * 10 ** rng.uniform(-6, 2) for _ in range(120)]
    every = np.concatenate(chunks)
    for capacity, histogram in ((every.size, False), (every.size // 3, True), (2_000, True), (2_000, False)):
        kept = LargestValues(capacity, histogram)
        for chunk in chunks:
            kept.add(chunk)
        assert kept.count == every.size
        for q in (0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0):
            found, exact = kept.quantile(q), np.quantile(every, q)
            needed = every.size - int(np.floor((every.size - 1) * q))  # (values from the top the quantile reads)
            if needed <= capacity:
                assert found.exact and found.value == exact, (capacity, q)
            else:
                assert not found.exact and found.low <= exact <= found.high == found.value, (capacity, q)
                if histogram:
                    assert found.high <= found.low * (1 + 2**-11 + 2**-23), (capacity, q)
        median = kept.median()
        assert median.value == np.median(every) if median.exact else median.low <= np.median(every) <= median.high
        assert median.exact == (capacity >= every.size // 2 + 1)
        limit = float(np.quantile(every, 0.999))
        over, at_least = kept.count_above(limit)
        assert over == int(np.count_nonzero(every > limit)) and not at_least  # (fewer than capacity are over it)
    assert LargestValues(4).quantile(0.5).value == 0.0  # (no values: 0, as the max of none)
