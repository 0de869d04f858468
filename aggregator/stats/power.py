"""Power and sample size of every local test as it is run (local-chi-square-tests spec §5), and an
advisor that ranks mechanisms by power for a planned study. Where the test with its ``calibration``
uses the asymptotic law, the plan uses the noncentral chi-square below; where the test simulates its
null, the plan simulates the test (``stats.simulated_power``; docs/calibration.md).

For a fixed alternative p1 the statistics are asymptotically noncentral chi-square with
noncentrality ``nu = n * (p1 - p0)^T W(p0) (p1 - p0)`` (goodness of fit) or
``nu = n * min_theta (p1 - p(theta))^T W(phi) (p1 - p(theta))`` (composite nulls), W being the
test's metric in de-biased units (with ``calibration="asymptotic"`` the Laplace tests use the
same Gaussian limit); the Gaussian ``imhof`` method and the support-count Pearson tests use a
weighted noncentral sum (for the support-count tests its four-cumulant approximation,
stats/ltz.py, which needs no eigendecomposition). The U-statistics T1/T2 (``method="t1"``/``"t2"``)
use their Satterthwaite law ([Satterthwaite1946]) with the exact mean and variances
(stats/identity.py; ``noncentrality`` gives E[T] / sd0(T)); T3 on public-coin one-bit reports
(``PublicCoinBit``, ``method="t3"``) uses ``identity.raptor_power``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

from aggregator.errors import InvalidInputError
from aggregator.stats.calibration import check_calibration, choose
from aggregator.stats.channel import (
    extra_variance,
    is_grouped,
    is_support,
    metric_matrix,
    quadratic_form,
    support_correlation,
    support_null,
)
from aggregator.stats.composite import COMPOSITE_METHODS
from aggregator.stats.gof import GOF_METHODS, U_METHODS, imhof_matrix
from aggregator.stats.identity import UMoments, raptor_power, u_moments, u_power
from aggregator.stats.imhof import weighted_chi2_isf, weighted_chi2_sf
from aggregator.stats.ltz import QuadraticMoments, ltz_isf, ltz_sf, quadratic_moments
from aggregator.stats.minchisq import fit_minimum_chi_square
from aggregator.stats.models import IndependenceModel, ParametricModel
from aggregator.stats.simulated_power import simulated_power
from aggregator.stats.validate import check_alpha, check_count, check_distribution, check_method
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
    as_public_coin,
)

#: Up to this many categories the support-count Pearson power uses the exact weighted chi-square
#: (eigendecomposition, Imhof); above, the four-cumulant law, which agrees with it within 0.002
#: in power from k = 3 (tests/stats/test_advisor_ranking.py) and keeps the advisor interactive.
EXACT_SUPPORT_PLAN = 0
#: Public random halves the advisor plans T3 with (large-domain spec §3: L = 5-20).
RAPTOR_GROUPS = 5


@dataclass(frozen=True)
class _Plan:
    """What the power of one test depends on, per unit of n."""

    mechanism: Mechanism
    method: str
    dof: int
    nu_per_n: float
    imhof: tuple[np.ndarray, np.ndarray] | None = None  # weights, per-n noncentralities
    alternative: np.ndarray = field(kw_only=True)
    null: np.ndarray = field(kw_only=True)  # p0, or the model's closest fit to the alternative
    model: ParametricModel | None = None
    u_moments: UMoments | None = None  # T1/T2 (stats/identity.py)
    cumulants: QuadraticMoments | None = None  # support-count Pearson at large k (stats/ltz.py)
    raptor_delta2: float | None = None  # T3: ||p1 - p0||^2


def _plan(
    mechanism: Mechanism,
    alternative: np.ndarray,
    null: np.ndarray | None,
    shape: tuple[int, int] | None,
    model: ParametricModel | None,
    method: str | None,
) -> _Plan:
    if not isinstance(mechanism, Mechanism):
        raise InvalidInputError("mechanism must be a client.mechanisms.Mechanism")
    if is_grouped(mechanism):
        return _raptor_plan(as_public_coin(mechanism), alternative, null, method)
    k = mechanism.k
    p1 = check_distribution(alternative, k, "alternative")
    chosen = [x is not None for x in (null, shape, model)]
    if sum(chosen) != 1:
        raise InvalidInputError("give exactly one of null (GOF), shape (independence) or model")
    if shape is not None:
        model = IndependenceModel(*shape)
        if model.k != k:
            raise InvalidInputError(f"shape {shape} does not match k={k}")
    if model is not None:
        return _composite_plan(mechanism, p1, model, method)
    p0 = check_distribution(null, k, "null")
    method = check_method(method, GOF_METHODS[type(mechanism)], mechanism.name)
    delta = p1 - p0
    if method in U_METHODS:
        moments = u_moments(mechanism, method, p0, p1)
        nu = moments.mean / math.sqrt(2 * moments.trace0_sq)  # n * nu ~ E[T] / sd0(T)
        return _Plan(mechanism, method, 0, nu, alternative=p1, null=p0, u_moments=moments)
    if method == "imhof":
        if (p0 <= 0).any():
            raise InvalidInputError("the imhof method needs every null cell > 0")
        lam, vectors = np.linalg.eigh(imhof_matrix(p0, extra_variance(mechanism)))
        mu = delta / np.sqrt(p0)
        imhof = (lam, (vectors.T @ mu) ** 2 / lam)
        return _Plan(mechanism, method, k, 0.0, imhof, alternative=p1, null=p0)
    if is_support(mechanism):
        mu = mechanism.slope * delta / np.sqrt(np.diag(mechanism.report_covariance(p0)))
        if k > EXACT_SUPPORT_PLAN:
            cumulants = quadratic_moments(support_correlation(mechanism, p0), mu)
            return _Plan(mechanism, method, k, 0.0, alternative=p1, null=p0, cumulants=cumulants)
        lam, vectors = support_null(mechanism, p0)
        keep = lam > 1e-12 * lam.max()
        imhof = (lam[keep], ((vectors.T @ mu) ** 2)[keep] / lam[keep])
        return _Plan(mechanism, method, k, 0.0, imhof, alternative=p1, null=p0)
    projected = method != "nonprojected"
    nu = float(quadratic_form(mechanism, delta, p0, projected))
    return _Plan(mechanism, method, k - 1 if projected else k, nu, alternative=p1, null=p0)


def _raptor_plan(mechanism: PublicCoinBit, alternative, null, method) -> _Plan:
    """T3 over public random halves: its power depends on p1 - p0 through ||Delta||^2 only."""
    if null is None:
        raise InvalidInputError(
            "public_coin_bit reports support goodness of fit (T3) only: they carry no "
            "per-category information for independence or composite tests"
        )
    method = check_method(method, ("t3",), mechanism.name)
    p1 = check_distribution(alternative, mechanism.k, "alternative")
    p0 = check_distribution(null, mechanism.k, "null")
    delta2 = float(np.sum((p1 - p0) ** 2))
    k, keep = mechanism.k, mechanism.keep_probability
    nu = (2 * keep - 1) ** 2 * k / (k - 1) * delta2 if k > 1 else 0.0
    return _Plan(
        mechanism, method, mechanism.groups, nu, alternative=p1, null=p0, raptor_delta2=delta2
    )


def _composite_plan(mechanism: Mechanism, p1: np.ndarray, model: ParametricModel, method):
    method = check_method(method, COMPOSITE_METHODS[type(mechanism)], mechanism.name)
    projected = method != "nonprojected"
    rough_theta = model.initial(p1[None, :])
    weights = metric_matrix(mechanism, model.probabilities(rough_theta), projected)
    theta = fit_minimum_chi_square(model, p1[None, :], weights, rough_theta)
    fitted = model.probabilities(theta)[0]
    residual = p1 - fitted
    nu = float(residual @ weights[0] @ residual)
    dof = mechanism.k - model.n_params - (1 if projected else 0)
    return _Plan(mechanism, method, dof, nu, alternative=p1, null=fitted, model=model)


def _simulated(plan: _Plan, n: float, calibration: str) -> bool:
    """Does the test as run with n reports calibrate by simulation, at a point where the
    chi-square law would not give its power? (Laplace tests always simulate, but where the
    diagnostics pass their power is the asymptotic one.)"""
    if plan.u_moments is not None or plan.raptor_delta2 is not None:
        return False  # T1/T2/T3: their own power laws (stats/identity.py)
    composite = plan.model is not None
    n = max(1, round(n))
    choice = choose(calibration, plan.mechanism, n, plan.null, composite=composite, planning=True)
    return choice.simulated


def _power_as_run(plan: _Plan, n: float, alpha: float, calibration: str) -> float:
    """Simulated power where the test simulates its null, else the asymptotic power."""
    if not _simulated(plan, n, calibration):
        return _power(plan, n, alpha)
    return simulated_power(
        plan.mechanism,
        plan.alternative,
        n,
        alpha,
        plan.method,
        null=None if plan.model else plan.null,
        model=plan.model,
        fitted=plan.null,
    )


def _power(plan: _Plan, n: float, alpha: float) -> float:
    if plan.u_moments is not None:
        return u_power(plan.u_moments, max(n, 2.0), alpha)
    if plan.raptor_delta2 is not None:
        mech = as_public_coin(plan.mechanism)
        return raptor_power(mech.k, mech.epsilon, n, plan.raptor_delta2, mech.groups, alpha)
    if plan.cumulants is not None:
        return ltz_sf(ltz_isf(alpha, plan.cumulants), plan.cumulants, n)
    if plan.imhof is not None:
        lam, per_n = plan.imhof
        return weighted_chi2_sf(_imhof_critical(alpha, lam.tobytes()), lam, n * per_n)
    critical = stats.chi2.isf(alpha, plan.dof)
    value = float(stats.ncx2.sf(critical, plan.dof, n * plan.nu_per_n))
    return 1.0 if np.isnan(value) else value  # SciPy gives NaN only far out in the upper tail


@lru_cache(maxsize=64)
def _imhof_critical(alpha: float, weights: bytes) -> float:
    """The null's upper-alpha quantile, computed once per plan (a search needs it at every n)."""
    return weighted_chi2_isf(alpha, np.frombuffer(weights))


def noncentrality(
    mechanism: Mechanism,
    alternative: np.ndarray,
    n: int,
    *,
    null: np.ndarray | None = None,
    shape: tuple[int, int] | None = None,
    model: ParametricModel | None = None,
    method: str | None = None,
) -> float:
    """Noncentrality nu of the test's limiting chi-square at sample size n.

    Parameters
    ----------
    mechanism, alternative, null, shape, model, method
        The planned study and its test, exactly as for ``power``.
    n : int
        Number of reports.

    Returns
    -------
    float
        ``nu = n * (p1 - p0)^T W (p1 - p0)`` (goodness of fit) or the minimum over the null family
        (composite nulls); for T1/T2 the standardised mean E[T] / sd0(T); for a weighted
        chi-square law the noncentrality of its weighted sum.

    Raises
    ------
    InvalidInputError
        Not exactly one of ``null``, ``shape``, ``model``; a malformed distribution, ``n`` or
        ``method``; a ``shape`` that does not match k.

    References
    ----------
    local-chi-square-tests spec §5 (noncentrality of each local test, after [Rogers2017] Ch. 6-8);
    the large-domain spec §3 for T1/T2.

    Examples
    --------
    >>> from aggregator.stats import noncentrality
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=4, epsilon=1.0)
    >>> nu = noncentrality(rr, [0.3, 0.3, 0.2, 0.2], 2000, null=[0.25, 0.25, 0.25, 0.25])
    >>> round(nu, 3)
    7.223
    """
    planned = check_count(n)
    return _noncentrality(_plan(mechanism, alternative, null, shape, model, method), planned)


def _noncentrality(plan: _Plan, n: float) -> float:
    if plan.imhof is not None:
        return float(n * np.sum(plan.imhof[1] * plan.imhof[0]))
    if plan.cumulants is not None:
        return n * plan.cumulants.shifts[0]
    return n * plan.nu_per_n


def power(
    mechanism: Mechanism,
    alternative: np.ndarray,
    n: int,
    *,
    null: np.ndarray | None = None,
    shape: tuple[int, int] | None = None,
    model: ParametricModel | None = None,
    alpha: float = 0.05,
    method: str | None = None,
    calibration: str = "auto",
) -> float:
    """Power at level alpha against the fixed alternative p1 with n reports, of the test as it
    is run with ``calibration``: simulated where that test simulates its null, else from the
    noncentral chi-square.

    Give ``null`` for goodness of fit, ``shape`` for independence or ``model`` for a composite
    null; ``method`` as in the corresponding test.

    Parameters
    ----------
    mechanism : Mechanism
        The mechanism the study will use, with its parameters.
    alternative : array_like of float, shape (k,)
        The true answer distribution p1 the study should detect.
    n : int
        Number of reports.
    null : array_like of float, optional
        The null distribution p0 of a goodness-of-fit test.
    shape : tuple of int, optional
        ``(r, c)`` of an independence test.
    model : ParametricModel, optional
        The null family of a composite test. Give exactly one of ``null``, ``shape``, ``model``.
    alpha : float, default 0.05
        Level of the planned test.
    method : str, optional
        The test's method; None is the test's default.
    calibration : {"auto", "asymptotic", "monte-carlo"}, default "auto"
        The calibration the test will run with.

    Returns
    -------
    float
        The probability, in [0, 1], that the test rejects when the answers follow p1.

    Raises
    ------
    InvalidInputError
        Not exactly one of ``null``, ``shape``, ``model``; a malformed distribution, ``n``,
        ``alpha``, ``method`` or ``calibration``; an effect too small to plan for.

    References
    ----------
    local-chi-square-tests spec §5 (from [Rogers2017] Ch. 6-8); the large-domain spec §3 for
    T1, T2, T3; [Liu2009] for the support-count tests at large k; docs/planning.md.

    Examples
    --------
    Power of the randomized-response goodness-of-fit test (epsilon = 1, 2,000 reports) against
    a shift of 0.05 in each cell, and of flip components at the same epsilon:

    >>> from aggregator.stats import power
    >>> from client.mechanisms import FlipComponents, RandomizedResponse
    >>> uniform, shifted = [0.25, 0.25, 0.25, 0.25], [0.3, 0.3, 0.2, 0.2]
    >>> round(power(RandomizedResponse(4, 1.0), shifted, 2000, null=uniform), 3)
    0.605
    >>> round(power(FlipComponents(4, 1.0), shifted, 2000, null=uniform), 3)
    0.424
    """
    alpha = check_alpha(alpha)
    planned = check_count(n)
    calibration = check_calibration(calibration)
    plan = _plan(mechanism, alternative, null, shape, model, method)
    return _power_as_run(plan, planned, alpha, calibration)


def sample_size(
    mechanism: Mechanism,
    alternative: np.ndarray,
    *,
    null: np.ndarray | None = None,
    shape: tuple[int, int] | None = None,
    model: ParametricModel | None = None,
    power: float = 0.8,
    alpha: float = 0.05,
    method: str | None = None,
    calibration: str = "auto",
) -> int:
    """Smallest n whose power, for the test as it is run with ``calibration``, reaches ``power``
    (the asymptotic answer where no n near it calibrates by simulation).

    Parameters
    ----------
    mechanism, alternative, null, shape, model, alpha, method, calibration
        The planned study and its test, exactly as for ``power``.
    power : float, default 0.8
        Target power, in (alpha, 1).

    Returns
    -------
    int
        The number of reports.

    Raises
    ------
    InvalidInputError
        ``power`` outside (alpha, 1); an alternative that satisfies the null; an effect that
        needs more than 10^12 reports; any input ``power()`` refuses.

    References
    ----------
    local-chi-square-tests spec §5 (from [Rogers2017] Ch. 6-8); docs/planning.md.

    Examples
    --------
    >>> from aggregator.stats import power, sample_size
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=4, epsilon=1.0)
    >>> uniform, shifted = [0.25, 0.25, 0.25, 0.25], [0.3, 0.3, 0.2, 0.2]
    >>> n = sample_size(rr, shifted, null=uniform)
    >>> n
    3019
    >>> power(rr, shifted, n, null=uniform) >= 0.8 > power(rr, shifted, n - 1, null=uniform)
    True
    """
    alpha = check_alpha(alpha)
    if isinstance(power, bool) or not isinstance(power, numbers.Real) or not alpha < power < 1:
        raise InvalidInputError(f"power must be in (alpha, 1), got {power!r}")
    calibration = check_calibration(calibration)
    plan = _plan(mechanism, alternative, null, shape, model, method)
    per_n = plan.nu_per_n if plan.imhof is None else float(np.sum(plan.imhof[1]))
    if plan.cumulants is not None:
        per_n = plan.cumulants.shifts[0]
    if not per_n > 0:
        raise InvalidInputError("the alternative satisfies the null: no sample size has power")
    n = _asymptotic_sample_size(plan, per_n, power, alpha)
    if calibration == "asymptotic" or not (
        _simulated(plan, n, calibration) or _simulated(plan, 1, calibration)
    ):
        return n
    return _searched_sample_size(plan, n, power, alpha, calibration)


def _searched_sample_size(plan: _Plan, start: int, target: float, alpha: float, calibration):
    """Bisection for the smallest n with power as run >= target, from the asymptotic answer."""
    hi = start
    while _power_as_run(plan, hi, alpha, calibration) < target:
        _check_plannable(2 * hi)
        hi *= 2
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _power_as_run(plan, mid, alpha, calibration) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def _asymptotic_sample_size(plan: _Plan, per_n: float, power: float, alpha: float) -> int:
    if plan.u_moments is not None or plan.cumulants is not None or plan.raptor_delta2 is not None:
        return _bisected_sample_size(plan, power, alpha)
    if plan.imhof is None:
        critical = stats.chi2.isf(alpha, plan.dof)
        target = optimize.brentq(
            lambda nu: stats.ncx2.sf(critical, plan.dof, nu) - power, 1e-9, 1e9
        )
        _check_plannable(target / per_n)
        n = max(1, math.ceil(target / per_n))
        for _ in range(8):  # power is increasing in n * per_n, so n is off by rounding at most
            if n > 1 and _power(plan, n - 1, alpha) >= power:
                n -= 1
            elif _power(plan, n, alpha) < power:
                n += 1
            else:
                break
        return n
    lam, per_cell = plan.imhof
    critical = stats.chi2.isf(alpha, lam.size)  # the chi-square guess bounds the work
    guess = optimize.brentq(lambda nu: stats.ncx2.sf(critical, lam.size, nu) - power, 1e-9, 1e9)
    _check_plannable(guess / float(np.sum(per_cell * lam)) * lam.min() / 10)
    return _bisected_sample_size(plan, power, alpha)


def _bisected_sample_size(plan: _Plan, power: float, alpha: float) -> int:
    """Smallest n with asymptotic power >= ``power``, by doubling then bisection."""
    hi = 1
    while _power(plan, hi, alpha) < power:
        _check_plannable(2 * hi)
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _power(plan, mid, alpha) >= power else (mid, hi)
    return hi


MAX_SAMPLE_SIZE = 10**12


def _check_plannable(n_needed: float) -> None:
    """Bound the work of planning: an effect this small is an error naming the n it needs."""
    if not n_needed <= MAX_SAMPLE_SIZE:
        raise InvalidInputError(
            f"alternative: the effect is too small to plan for; it needs about n = "
            f"{n_needed:.3g} reports (the limit is {MAX_SAMPLE_SIZE:.0e})"
        )


@dataclass(frozen=True)
class Advice:
    """One mechanism's test and its predicted power for a planned study."""

    mechanism: Mechanism
    method: str
    power: float
    noncentrality: float
    note: str = ""


def advise(
    k: int,
    epsilon: float,
    alternative: np.ndarray,
    n: int,
    *,
    null: np.ndarray | None = None,
    shape: tuple[int, int] | None = None,
    alpha: float = 0.05,
    u_statistics: bool = True,
) -> list[Advice]:
    """Rank every mechanism and test by power as run (``calibration="auto"``) for
    (k, epsilon, null or shape, alternative, n), best first: each mechanism's default test and,
    for goodness of fit, the rate-optimal tests of the large-domain spec §3: the U-statistics
    ("t1"/"t2" where the mechanism has them) and T3 on public-coin one-bit reports
    (``PublicCoinBit`` with ``RAPTOR_GROUPS`` public halves, planned by ``raptor_power``).
    ``u_statistics=False`` leaves those out.

    Gaussian noise is compared at rho = epsilon^2 / 2, a weaker guarantee than epsilon-LDP.

    Parameters
    ----------
    k : int
        Number of categories of the question.
    epsilon : float
        The per-report privacy budget every candidate mechanism gets.
    alternative, n, null, shape, alpha
        The planned study, as for ``power``; there is no ``model``: give exactly one of
        ``null`` (goodness of fit) and ``shape`` (independence).
    u_statistics : bool, default True
        Also rank the rate-optimal tests (goodness of fit only).

    Returns
    -------
    list of Advice
        One entry per mechanism and test: ``mechanism``, ``method``, predicted ``power``,
        ``noncentrality`` and a ``note``, highest power first.

    Raises
    ------
    InvalidInputError
        A ``k`` or ``epsilon`` no mechanism accepts; a malformed distribution, ``n`` or
        ``alpha``; neither or both of ``null`` and ``shape``.

    References
    ----------
    local-chi-square-tests spec §5; the large-domain spec §3 and [Acharya2019Test] (T1, T2, T3);
    [Wang2017], [Acharya2019HR], [Ye2018] (the large-domain mechanisms).

    Examples
    --------
    >>> from aggregator.stats import advise
    >>> ranking = advise(4, 1.0, [0.3, 0.3, 0.2, 0.2], 2000, null=[0.25] * 4, u_statistics=False)
    >>> [(a.mechanism.name, a.method) for a in ranking[:2]]
    [('gaussian', 'projected'), ('randomized_response', 'pearson')]
    >>> ranking[0].note
    'rho = eps^2/2 zCDP: weaker than eps-LDP'
    >>> all(a.power >= b.power for a, b in zip(ranking, ranking[1:]))
    True
    """
    planned = check_count(n)
    alpha = check_alpha(alpha)
    try:
        candidates: list[tuple[Mechanism, str]] = [
            (RandomizedResponse(k, epsilon), ""),
            (FlipComponents(k, epsilon), ""),
            (LaplaceNoise(k, epsilon), ""),
            (GaussianNoise(k, epsilon**2 / 2), "rho = eps^2/2 zCDP: weaker than eps-LDP"),
            (OptimizedUnaryEncoding(k, epsilon), ""),
            (HadamardResponse(k, epsilon), ""),
            (SubsetSelection(k, epsilon), ""),
            (LocalHashing(k, epsilon), ""),
        ]
        raptor = PublicCoinBit(k, epsilon, 0, RAPTOR_GROUPS)
    except (ValueError, TypeError, OverflowError) as exc:
        name = "k" if str(exc).startswith("k ") else "epsilon"
        raise InvalidInputError(f"{name}: {exc}") from None
    tests: list[tuple[Mechanism, str, str | None]] = [
        (mech, note, None) for mech, note in candidates
    ]
    if u_statistics and null is not None and k > 1:  # rate-optimal tests, for large k
        for mech, _ in candidates:
            tests += [(mech, _U_NOTES[m], m) for m in GOF_METHODS[type(mech)] if m in U_METHODS]
        tests.append((raptor, f"public coins: {RAPTOR_GROUPS} public random halves", "t3"))
    advice = []
    for mech, note, method in tests:
        plan = _plan(mech, alternative, null, shape, None, method)
        predicted = _power_as_run(plan, planned, alpha, "auto")
        if _simulated(plan, planned, "auto"):
            note = "; ".join(x for x in (note, "power of the calibrated test, simulated") if x)
        advice.append(Advice(mech, plan.method, predicted, _noncentrality(plan, planned), note))
    return sorted(advice, key=lambda a: -a.power)


_U_NOTES = {"t1": "T1 U-statistic", "t2": "T2 U-statistic"}
