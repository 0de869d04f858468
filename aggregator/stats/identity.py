"""Rate-optimal identity tests for large domains (large-domain spec §3, after [Acharya2019Test]),
from aggregates only.

* **T1** (``method="t1"`` of flip components): the unbiased U-statistic on symmetric unary
  reports, ``T = sum_j [(N_j - n q0_j)^2 - N_j (1 - 2 q0_j) - n q0_j^2]`` with N_j the bit sums
  and q0 = s + (1 - 2s) p0. It equals ``sum_{i != i'} <Y_i - q0, Y_i' - q0>``, so
  ``E[T] = n (n - 1) (1 - 2s)^2 ||p - p0||^2`` exactly and, under H0,
  ``Var T = 2 n (n - 1) ||C0||_F^2`` with C0 the covariance of one report.
* **T2** (``channel_test``; ``method="t2"`` of randomized response): the same statistic on the
  counts of a finite-output channel W (outputs x categories), q0 = W p0,
  ``E[T] = n (n - 1) ||W (p - p0)||^2`` and C0 = Diag q0 - q0 q0^T. Any mechanism whose report
  is one of finitely many outputs plugs in through its channel matrix.
* **T1/T2 on support counts** (``method="t1"`` of optimized unary encoding, ``"t2"`` of Hadamard
  response, subset selection, local hashing): the same statistic on the support counts N_j with
  q0 = offset + slope p0. The support indicators are 0/1 with E[Z | X = x] = offset + slope e_x,
  so it is again ``sum_{i != i'} <Z_i - q0, Z_i' - q0>``: ``E[T] = n (n - 1) slope^2 ||p - p0||^2``
  and C0 the mechanism's ``report_covariance(p0)``. For Hadamard response this is T2 on the
  Hadamard coefficients that carry the answer: with M the column counts, N_j = (n + (H M)_{j+1})/2,
  and by Parseval T2 on M equals 4/K times this statistic plus the terms of rows 0 and k+1..K-1,
  which have mean zero under every p (pure noise; none when k = K - 1). The stored support counts
  therefore suffice, and dropping the noise rows keeps the mean and lowers the variance.
* **T3** (``raptor_test``): the public-coin grouped chi-square of one-bit RAPTOR reports.

Both U-statistics are calibrated by exact Monte Carlo from the aggregate sampler at p0 (T1: bit
sums Bin(c_j, 1 - s) + Bin(n - c_j, s) given c ~ Mult(n, p0); T2: counts ~ Mult(n, W p0); T3: L
independent binomials); ``calibration="asymptotic"`` uses the normal law with the exact null
variance, accurate only for large k. Rejection is one-sided (large T).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special  # not scipy.stats, which costs a second of start-up

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.calibration import MIN_EFFECTIVE_COUNT, check_calibration
from aggregator.stats.channel import is_support
from aggregator.stats.montecarlo import check_draws, monte_carlo_pvalue
from aggregator.stats.result import ResultFields, TestResult
from aggregator.stats.validate import check_alpha, check_distribution, make_rng
from client.mechanisms import Mechanism, SupportMechanism, as_public_coin

T1_LABEL = "T1: U-statistic on unary reports (flip components)"
T2_LABEL = "T2: U-statistic on channel output counts"
T3_LABEL = "T3: public-coin grouped chi-square (RAPTOR)"


def u_statistic(counts: np.ndarray, n: int, q0: np.ndarray) -> np.ndarray:
    """``sum_y [(M_y - n q0_y)^2 - M_y (1 - 2 q0_y) - n q0_y^2]`` per row of ``counts``."""
    counts = np.asarray(counts, dtype=float)
    terms = (counts - n * q0) ** 2 - counts * (1 - 2 * q0) - n * q0**2
    return np.sum(terms, axis=-1)


def null_variance(n: int, frobenius2: float) -> float:
    """``Var0 T = 2 n (n - 1) ||C0||_F^2``."""
    return 2.0 * n * (n - 1) * frobenius2


def multinomial_frobenius2(q: np.ndarray) -> float:
    """``||Diag q - q q^T||_F^2`` without forming the matrix."""
    s2 = float(np.sum(q**2))
    return s2 - 2 * float(np.sum(q**3)) + s2**2


def unary_frobenius2(mech: Mechanism, p: np.ndarray) -> float:
    """``||c^2 (Diag p - p p^T) + s (1 - s) I||_F^2`` (c = 1 - 2s), the covariance of one flip
    components report (``statistic_kind`` "bits": offset s, slope c), without forming the
    matrix."""
    c2 = mech.slope**2
    s = mech.offset  # the flip probability
    a = s * (1 - s)
    s2 = float(np.sum(p**2))
    return c2**2 * multinomial_frobenius2(p) + 2 * a * c2 * (1 - s2) + a**2 * p.size


def support_u_frobenius2(mech: SupportMechanism, p: np.ndarray) -> float:
    """``||C||_F^2`` of one report's support indicators (``report_covariance``, k x k)."""
    return float(np.sum(mech.report_covariance(p) ** 2))


def channel_matrix(mech: Mechanism) -> np.ndarray:
    """W (outputs x categories), W[y, x] = P(report y | answer x), of a finite-output mechanism:
    its own ``channel_matrix()`` (k-ary randomized response: a0 + a1 I)."""
    own = getattr(mech, "channel_matrix", None)
    if callable(own):
        return np.asarray(own(), dtype=float)
    raise InvalidInputError(f"{mech.describe()} has no finite-output channel: T2 does not apply")


def check_channel(channel: object, k: int) -> np.ndarray:
    """A column-stochastic matrix with k columns."""
    try:
        w = np.array(channel, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError("channel must be a matrix of probabilities") from exc
    if w.ndim != 2 or w.shape[1] != k:
        raise InvalidInputError(f"channel must have shape (outputs, {k}), got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise InvalidInputError("channel entries must be finite and >= 0")
    if not np.allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-9):
        raise InvalidInputError("every column of the channel must sum to 1")
    return w


def u_test(
    statistic: float,
    draws_of: Callable[[], np.ndarray],
    variance0: float,
    label: str,
    *,
    n: int,
    alpha: float,
    calibration: str,
    n_draws: int,
    expected: np.ndarray,
    observed: np.ndarray,
    mechanism: str,
) -> TestResult:
    """The TestResult of T1/T2: Monte Carlo unless ``calibration="asymptotic"`` (normal law).
    ``draws_of()`` returns the statistic on ``n_draws`` exact null draws."""
    common = ResultFields(
        method=label,
        n=n,
        alpha=alpha,
        expected=expected,
        observed=observed,
        mechanism=mechanism,
    )
    if calibration == "asymptotic":
        pvalue = float(special.ndtr(-statistic / math.sqrt(variance0))) if variance0 > 0 else 1.0
        return TestResult(
            statistic,
            pvalue,
            None,
            reject=pvalue <= alpha,
            calibration="asymptotic",
            calibration_reason="requested; normal law with the exact null variance",
            **common,
        )
    reason = "requested" if calibration == "monte-carlo" else "T1/T2 always simulate their null"
    pvalue = monte_carlo_pvalue(statistic, draws_of())
    return TestResult(
        statistic,
        pvalue,
        None,
        reject=pvalue <= alpha,
        calibration="monte-carlo",
        calibration_reason=f"{reason}; exact null draws from the aggregates at p0",
        n_draws=n_draws,
        **common,
    )


def channel_test(
    output_counts: np.ndarray,
    channel: np.ndarray,
    p0: np.ndarray,
    alpha: float = 0.05,
    *,
    calibration: str = "auto",
    rng: np.random.Generator | int | None = None,
    n_draws: int = 999,
    mechanism: str = "",
) -> TestResult:
    """T2: H0 p = p0 from the output counts of n reports of a finite-output channel W."""
    counts = np.asarray(output_counts, dtype=float)
    if counts.ndim != 1 or not np.isfinite(counts).all() or (counts < 0).any():
        raise InvalidInputError("output_counts must be a vector of non-negative counts")
    if not np.array_equal(counts, np.round(counts)):
        raise InvalidInputError("output_counts must be integers")
    w = check_channel(channel, np.asarray(p0).size)
    if counts.size != w.shape[0]:
        raise InvalidInputError(f"output_counts has {counts.size} cells, the channel {w.shape[0]}")
    p0 = check_distribution(p0, w.shape[1])
    alpha = check_alpha(alpha)
    calibration = check_calibration(calibration)
    n_draws = check_draws(n_draws, alpha)
    n = int(counts.sum())
    if n < 2:
        raise InvalidInputError(f"T2 needs at least 2 reports, got {n}")
    q0 = w @ p0
    q0 = q0 / q0.sum()
    statistic = float(u_statistic(counts, n, q0))
    generator = make_rng(rng)
    return u_test(
        statistic,
        lambda: u_statistic(generator.multinomial(n, q0, size=n_draws), n, q0),
        null_variance(n, multinomial_frobenius2(q0)),
        T2_LABEL,
        n=n,
        alpha=alpha,
        calibration=calibration,
        n_draws=n_draws,
        expected=n * q0,
        observed=counts.copy(),
        mechanism=mechanism,
    )


@dataclass(frozen=True)
class UMoments:
    """Per-pair moments of T1/T2 at an alternative p1, mu = E[Y | p1] - q0: E T = n(n-1) mean,
    Var0 T = 2n(n-1) trace0_sq, Var1 T = 2n(n-1) trace1_sq + 4n(n-1)^2 linear."""

    mean: float  # ||mu||^2
    trace0: float  # tr C0
    trace0_sq: float  # ||C0||_F^2
    trace1: float  # tr C1
    trace1_sq: float  # ||C1||_F^2
    linear: float  # mu^T C1 mu


def u_moments(mech: Mechanism, method: str, p0: np.ndarray, p1: np.ndarray) -> UMoments:
    """The moments of T1 (``method="t1"``) or T2 (``"t2"``) at p1 under the null p0."""
    if is_support(mech):  # the U-statistic on the 0/1 support indicators
        mu = mech.slope * (p1 - p0)
        c0, c1 = mech.report_covariance(p0), mech.report_covariance(p1)
        return UMoments(
            float(mu @ mu),
            float(np.trace(c0)),
            float(np.sum(c0**2)),
            float(np.trace(c1)),
            float(np.sum(c1**2)),
            float(mu @ c1 @ mu),
        )
    if method == "t1":
        mu = mech.slope * (p1 - p0)
        s = mech.offset  # flip components: the flip probability
        noise = s * (1 - s) * p0.size
        return UMoments(
            float(mu @ mu),
            mech.slope**2 * (1 - float(p0 @ p0)) + noise,
            unary_frobenius2(mech, p0),
            mech.slope**2 * (1 - float(p1 @ p1)) + noise,
            unary_frobenius2(mech, p1),
            float(mu @ mech.report_covariance(p1) @ mu),
        )
    w = channel_matrix(mech)
    q0, q1 = w @ p0, w @ p1
    mu = q1 - q0
    return UMoments(
        float(mu @ mu),
        1 - float(q0 @ q0),
        multinomial_frobenius2(q0),
        1 - float(q1 @ q1),
        multinomial_frobenius2(q1),
        float(np.sum(q1 * mu**2) - (q1 @ mu) ** 2),
    )


_GRID = (np.arange(4000) + 0.5) / 4000


def u_power(moments: UMoments, n: float, alpha: float) -> float:
    """Power of T1/T2 with n reports. T is ||sum_i Z_i||^2 - sum_i ||Z_i||^2: its quadratic part is
    a weighted chi-square, matched by b (chi2_d - d) with d = (tr C)^2 / ||C||_F^2 and the exact
    variance (Welch-Satterthwaite: [Welch1947], [Satterthwaite1946]; it tends to the normal law as k
    grows), plus under the alternative an independent normal linear part. The null's upper alpha
    quantile is the critical value; the power averages over quantiles of the alternative's quadratic
    part."""
    pairs = n * (n - 1)
    d0, b0 = _satterthwaite(moments.trace0, moments.trace0_sq, pairs)
    critical = b0 * (special.chdtri(d0, alpha) - d0)
    margin = critical - pairs * moments.mean
    if moments.trace1_sq > 0:
        d1, b1 = _satterthwaite(moments.trace1, moments.trace1_sq, pairs)
        margin = margin - b1 * (special.chdtri(d1, 1 - _GRID) - d1)
    linear_sd = math.sqrt(4 * pairs * (n - 1) * max(moments.linear, 0.0))
    if linear_sd == 0:
        return float(np.mean(np.asarray(margin) < 0))
    return float(np.mean(special.ndtr(-margin / linear_sd)))


def _satterthwaite(trace: float, trace_sq: float, pairs: float) -> tuple[float, float]:
    """(d, b) of b (chi2_d - d) with the variance 2 pairs ||C||_F^2 of the quadratic part."""
    d = trace**2 / trace_sq
    return d, math.sqrt(pairs * trace_sq / d)


def raptor_test(
    bit_sums: np.ndarray,
    group_sizes: np.ndarray,
    subset_masks: np.ndarray,
    p0: np.ndarray,
    epsilon: float,
    alpha: float = 0.05,
    *,
    rng: np.random.Generator | int | None = None,
    n_draws: int = 999,
) -> TestResult:
    """T3: H0 p = p0 from RAPTOR one-bit reports in L public groups.

    ``bit_sums[l]`` ones among ``group_sizes[l]`` reports of group l, whose devices reported
    ``1{x in S_l} XOR Bern(1 / (1 + e^eps))`` for the public subset ``subset_masks[l]`` (L x k
    booleans). Under H0, B_l ~ Bin(n_l, mu_l), mu_l = (1 - r) + (2r - 1) p0(S_l),
    r = e^eps / (1 + e^eps); ``Q = sum_l (B_l - n_l mu_l)^2 / (n_l mu_l (1 - mu_l))`` with an exact
    Monte Carlo p-value from L independent binomials (groups with no report are left out).
    """
    masks = np.asarray(subset_masks)
    if masks.ndim != 2 or masks.dtype != bool:
        raise InvalidInputError("subset_masks must be an (L, k) boolean matrix")
    p0 = check_distribution(p0, masks.shape[1])
    sums, sizes = _group_counts(bit_sums, group_sizes, masks.shape[0])
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise InvalidInputError(f"epsilon must be a positive number, got {epsilon!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidInputError(f"epsilon must be positive and finite, got {epsilon!r}")
    alpha = check_alpha(alpha)
    n_draws = check_draws(n_draws, alpha)
    keep = 1 / (1 + math.exp(-epsilon))
    mu = (1 - keep) + (2 * keep - 1) * (masks @ p0)
    label = f"raptor(k={masks.shape[1]}, epsilon={epsilon:g}, groups={masks.shape[0]})"
    return _t3(sums, sizes, mu, alpha, "monte-carlo", make_rng(rng), n_draws, label)


def t3_test(
    hist: Histogram,
    p0: np.ndarray,
    alpha: float,
    calibration: str,
    rng: np.random.Generator,
    n_draws: int,
) -> TestResult:
    """T3 on a ``PublicCoinBit`` histogram ([n_l], then [B_l]): ``calibration="auto"`` uses the
    chi-square(L) limit where every group with reports expects at least ``MIN_EFFECTIVE_COUNT`` ones
    and zeros (n_l min(mu_l, 1 - mu_l), Cochran's rule [Cochran1954] as for the other mechanisms),
    else exact binomial draws given the group sizes."""
    mech = as_public_coin(hist.mechanism)
    sizes, sums = np.split(hist.values, 2)
    return _t3(
        sums, sizes, mech.bit_probabilities(p0), alpha, calibration, rng, n_draws, mech.describe()
    )


def _t3(sums, sizes, mu, alpha, calibration, rng, n_draws, label) -> TestResult:
    """Q = sum_l (B_l - n_l mu_l)^2 / (n_l mu_l (1 - mu_l)) over the groups with reports, with
    its chi-square(L) p-value or an exact Monte Carlo one (L binomials given the sizes)."""
    used = sizes > 0
    if not used.any():
        raise InvalidInputError("T3 needs at least one report")
    sums, sizes, mu = sums[used], sizes[used], mu[used]
    if ((mu <= 0) | (mu >= 1)).any():  # only at infinite epsilon, refused upstream
        raise InvalidInputError("T3 needs every group's bit probability inside (0, 1)")
    scale = sizes * mu * (1 - mu)

    def statistic_of(b: np.ndarray) -> np.ndarray:
        return np.sum((b - sizes * mu) ** 2 / scale, axis=-1)

    statistic = float(statistic_of(sums))
    fewest = float(np.min(sizes * np.minimum(mu, 1 - mu)))
    if calibration == "auto":
        simulated = fewest < MIN_EFFECTIVE_COUNT
        reason = (
            f"a group expects {fewest:.1f} < {MIN_EFFECTIVE_COUNT:g} ones or zeros"
            if simulated
            else f"every group expects >= {MIN_EFFECTIVE_COUNT:g} ones and zeros"
        )
    else:
        simulated, reason = calibration == "monte-carlo", "requested"
    common = ResultFields(
        method=T3_LABEL,
        n=int(sizes.sum()),
        alpha=alpha,
        expected=sizes * mu,
        observed=sums.astype(float),
        mechanism=label,
    )
    if not simulated:
        dof = int(sizes.size)
        pvalue = float(special.chdtrc(dof, statistic))
        return TestResult(
            statistic, pvalue, dof, reject=pvalue <= alpha, calibration_reason=reason, **common
        )
    draws = rng.binomial(sizes.astype(np.int64), mu, size=(n_draws, sizes.size))
    pvalue = monte_carlo_pvalue(statistic, statistic_of(draws))
    return TestResult(
        statistic,
        pvalue,
        None,
        reject=pvalue <= alpha,
        calibration="monte-carlo",
        calibration_reason=reason,
        n_draws=n_draws,
        **common,
    )


def _group_counts(bit_sums: object, group_sizes: object, groups: int):
    try:
        sums = np.array(bit_sums, dtype=float)
        sizes = np.array(group_sizes, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError("bit_sums and group_sizes must be vectors of counts") from exc
    if sums.shape != (groups,) or sizes.shape != (groups,):
        raise InvalidInputError(f"bit_sums and group_sizes need one count per group ({groups})")
    if not (np.isfinite(sums).all() and np.isfinite(sizes).all()):
        raise InvalidInputError("bit_sums and group_sizes must be finite")
    if not (np.array_equal(sums, np.round(sums)) and np.array_equal(sizes, np.round(sizes))):
        raise InvalidInputError("bit_sums and group_sizes must be integers")
    if (sums < 0).any() or (sums > sizes).any():
        raise InvalidInputError("every bit sum must lie in 0..its group size")
    return sums, sizes


def raptor_power(
    k: int, epsilon: float, n: float, delta_norm2: float, groups: int, alpha: float
) -> float:
    """Predicted power of T3 over the public random halves (a new design per study).

    Group l's standardised deviation is Z_l + c W_l: Z_l the binomial noise, and W_l standard
    normal since p(S_l) - p0(S_l) is a sum over a random half (variance k / (4(k - 1)) ||Delta||^2),
    with c^2 = nu / L, ``nu = n (2r - 1)^2 k / (k - 1) ||Delta||^2`` (mu (1 - mu) ~ 1/4 near
    uniform). So Q ~ (1 + nu / L) chi-square(L), not a noncentral chi-square: the design's
    randomness costs power (at k = 1,024, eps = 1, L = 5 the noncentral law would promise power
    0.8 at 30% fewer reports than simulation shows)."""
    keep = 1 / (1 + math.exp(-epsilon))
    nu = n * (2 * keep - 1) ** 2 * k / (k - 1) * delta_norm2
    return float(special.chdtrc(groups, special.chdtri(groups, alpha) / (1 + nu / groups)))
