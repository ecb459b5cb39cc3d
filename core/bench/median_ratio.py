"""How far a ratio of two medians can be trusted: its bootstrap interval.

Each sample set is resampled with replacement, the ratio of the resampled medians taken each time; the interval is
that ratio's 2.5-97.5 % range. Idle TTFTs of one server spread widely (on the H200, 10 TTFTs of a 32k prompt over
95-129 ms; 15 of a 1k prompt over 100-208 ms), so a ratio of medians is read beside its interval and an A/A pair's.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence


def median_ratio_interval(num: Sequence[float], den: Sequence[float], *, resamples: int = 4000,
                          seed: int = 0) -> tuple[float, float]:
    """The 2.5 % and 97.5 % points of median(num) / median(den) over `resamples` bootstrap resamples (seeded)."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(num, k=len(num))) / statistics.median(rng.choices(den, k=len(den)))
                    for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]
