"""The statistics under a sweep's metrics, in numpy: a clustered standard error, a cluster
bootstrap interval and a paired sign-flip permutation test, all seeded."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

RESAMPLES = 2000
"""Bootstrap resamples per interval."""
SEED = 0
"""The default seed of every resampling (the same sweep gives the same interval)."""
CONFIDENCE = 0.95
"""The default confidence level of an interval."""
FLIPS = 9999
"""Random sign flips of a permutation test too large to enumerate."""
EXACT_CLUSTERS = 12
"""A permutation test over at most this many rows enumerates all 2**k sign flips."""
_CHUNK = 4_000_000
"""Bootstrap draws held in memory at once (resamples × rows), ~32 MB of int64."""

CI_METHOD = (
    "cluster bootstrap, expanded percentile interval (Hesterberg 2015): {resamples} resamples "
    "of the dataset rows with replacement (a row's repeats and its other cells in the group "
    "drawn together; without rows, a cell's repeats), numpy.random.default_rng({seed}); "
    "{level:g} %, the percentile levels widened for G rows to Phi(-sqrt(G/(G-1)) t_(G-1))"
)
"""How ``ci_low``/``ci_high`` are computed (named in frames' ``attrs`` and in docs)."""
STDERR_METHOD = (
    "cluster-robust standard error of the mean: sqrt(G/(G-1) * sum_g (sum of x - mean over "
    "row g)^2) / n over G rows (the plain s/sqrt(n) when each row is one cell)"
)
"""How ``stderr`` is computed."""
TEST_METHOD = (
    "paired permutation test, two-sided: the signs of the per-row sums of differences flipped "
    "(all 2**k flips when k <= {exact} rows, else {flips} random flips with "
    "numpy.random.default_rng({seed}), p = (1 + hits) / (1 + flips))"
)
"""How ``p_value`` is computed."""


def clusters_of(keys: Sequence[object]) -> NDArray[np.int64]:
    """Cluster codes 0..G-1 for ``keys`` (equal keys, one cluster), in order of appearance."""
    import numpy as np

    codes: dict[object, int] = {}
    return np.array([codes.setdefault(k, len(codes)) for k in keys], dtype=np.int64)


def _sums(
    values: NDArray[np.float64], clusters: NDArray[np.int64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    import numpy as np

    groups = int(clusters.max()) + 1 if len(clusters) else 0
    sums = np.bincount(clusters, weights=values, minlength=groups).astype(np.float64)
    sizes = np.bincount(clusters, minlength=groups).astype(np.float64)
    keep = sizes > 0
    return sums[keep], sizes[keep]


def clustered_stderr(values: NDArray[np.float64], clusters: NDArray[np.int64]) -> float:
    """The cluster-robust standard error of ``values``' mean (NaN under two clusters)."""
    import numpy as np

    if len(values) == 0:
        return float("nan")
    mean = float(values.mean())
    centred, _ = _sums(values - mean, clusters)
    groups = len(centred)
    if groups < 2:
        return float("nan")
    return float(np.sqrt(groups / (groups - 1) * np.sum(centred**2)) / len(values))


def bootstrap_ci(
    values: NDArray[np.float64],
    clusters: NDArray[np.int64],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """The percentile interval of the mean of ``values`` over ``resamples`` draws of whole
    clusters with replacement (NaN, NaN under two clusters)."""
    import numpy as np

    sums, sizes = _sums(values, clusters)
    groups = len(sums)
    if groups < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    step = max(1, _CHUNK // groups)
    for start in range(0, resamples, step):
        stop = min(resamples, start + step)
        draws = rng.integers(0, groups, size=(stop - start, groups))
        means[start:stop] = sums[draws].sum(axis=1) / sizes[draws].sum(axis=1)
    tail = expanded_tail(confidence, groups)
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def expanded_tail(confidence: float, groups: int) -> float:
    """The lower percentile level of the expanded percentile interval over ``groups`` rows:
    ``Phi(-sqrt(G/(G-1)) * t_{G-1})``, which corrects the plain percentile interval's
    narrowness in small samples (the bootstrap's variance is (G-1)/G of the mean's)."""
    normal = NormalDist()
    z = normal.inv_cdf(1 - (1 - confidence) / 2)
    t = t_quantile(z, groups - 1)
    return normal.cdf(-math.sqrt(groups / (groups - 1)) * t)


def t_quantile(z: float, dof: int) -> float:
    """Student's t quantile for the normal quantile ``z`` and ``dof`` degrees of freedom
    (Abramowitz & Stegun 26.7.5; within 0.01 of the exact value from 3 degrees of freedom,
    too small below, where the interval is wide anyway)."""
    v = float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def sign_flip_p_value(
    differences: NDArray[np.float64],
    clusters: NDArray[np.int64],
    *,
    flips: int = FLIPS,
    seed: int = SEED,
) -> float:
    """The two-sided p-value of a mean difference of zero: each row's summed differences
    keep or flip their sign (exactly over all flips for few rows, else at random)."""
    import numpy as np

    sums, _ = _sums(differences, clusters)
    if len(sums) == 0:
        return float("nan")
    observed = abs(float(sums.sum()))
    tolerance = 1e-9 * max(1.0, float(np.abs(sums).sum()))
    if len(sums) <= EXACT_CLUSTERS:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(sums))))
        totals = np.abs(signs @ sums)
        return float(np.mean(totals >= observed - tolerance))
    rng = np.random.default_rng(seed)
    hits = 0
    step = max(1, _CHUNK // len(sums))
    for start in range(0, flips, step):
        count = min(flips, start + step) - start
        signs = rng.choice(np.array([1.0, -1.0]), size=(count, len(sums)))
        hits += int(np.sum(np.abs(signs @ sums) >= observed - tolerance))
    return (1 + hits) / (1 + flips)
