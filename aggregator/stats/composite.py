"""Composite nulls p = p(theta): the local minimum chi-square test (local-chi-square-tests spec
§3.5, §3.7, §4.3, §4.6, §4.7; [Rogers2017] Sec. 7.1.2, Alg. 15, 19), with independence of an
r x c table as its main instance.

In de-biased units v = p_hat, the statistic is ``n min_theta (v - p(theta))^T W (v - p(theta))``
where W is the mechanism's metric (``channel.metric_matrix``) evaluated at the rough estimate
p(phi). Randomized response reports the [Rogers2017] Alg. 19 form (denominators at p(theta_hat));
the projected forms for additive noise and flip components use ``Pi S_b^{-1} Pi`` and have k - 1 - s
degrees of freedom (derivation for flip components in docs/flip-independence.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.calibration import Choice, check_calibration, choose, simulate_null
from aggregator.stats.channel import (
    debiased,
    is_randomized_response,
    is_support,
    metric_matrix,
    quadratic_form,
    rough_distribution,
)
from aggregator.stats.minchisq import fit_minimum_chi_square
from aggregator.stats.models import IndependenceModel, ParametricModel
from aggregator.stats.montecarlo import check_draws, monte_carlo_pvalue
from aggregator.stats.result import CalibratedFields, TestResult
from aggregator.stats.validate import (
    check_alpha,
    check_finite_statistic,
    check_histogram,
    check_method,
    check_per_category,
    make_rng,
)
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    RandomizedResponse,
    SubsetSelection,
)

COMPOSITE_METHODS: dict[type, tuple[str, ...]] = {
    RandomizedResponse: ("min-chi-square",),
    GaussianNoise: ("projected", "nonprojected"),
    LaplaceNoise: ("bootstrap",),
    FlipComponents: ("projected", "nonprojected"),
    OptimizedUnaryEncoding: ("bootstrap",),
    HadamardResponse: ("bootstrap",),
    SubsetSelection: ("bootstrap",),
    LocalHashing: ("bootstrap",),
}

_LABELS = {
    (RandomizedResponse, "min-chi-square"): "LocalGeneral: minimum chi-square on privatized counts",
    (GaussianNoise, "projected"): "projected GenChiTest, Gaussian noise",
    (GaussianNoise, "nonprojected"): "non-projected GenChiTest, Gaussian noise",
    (LaplaceNoise, "bootstrap"): "projected GenChiTest, Laplace noise",
    (FlipComponents, "projected"): "projected general chi-square, flip components",
    (FlipComponents, "nonprojected"): "non-projected general chi-square, flip components",
    (OptimizedUnaryEncoding, "bootstrap"): "minimum support-count Pearson, optimized unary",
    (HadamardResponse, "bootstrap"): "minimum support-count Pearson, Hadamard response",
    (SubsetSelection, "bootstrap"): "minimum support-count Pearson, subset selection",
    (LocalHashing, "bootstrap"): "minimum support-count Pearson, local hashing",
}

MIN_EXPECTED_CELL = 5.0


@dataclass(frozen=True)
class _Fit:
    statistic: np.ndarray
    fitted: np.ndarray
    rough: np.ndarray


def _fit(mech: Mechanism, model: ParametricModel, values: np.ndarray, n: int, projected: bool):
    """Rough estimate, metric, minimum chi-square fit and statistic for each row of values."""
    rough_theta = model.initial(rough_distribution(values, n, mech))
    rough = model.probabilities(rough_theta)
    weights = metric_matrix(mech, rough, projected)
    v = debiased(values, n, mech)
    theta = fit_minimum_chi_square(model, v, weights, rough_theta)
    fitted = model.probabilities(theta)
    residual = v - fitted
    if is_randomized_response(mech):
        statistic = n * quadratic_form(mech, residual, fitted)
    else:
        statistic = n * np.einsum("mi,mij,mj->m", residual, weights, residual)
    return _Fit(statistic, fitted, rough)


def composite(
    hist: Histogram,
    model: ParametricModel,
    alpha: float = 0.05,
    method: str | None = None,
    *,
    calibration: str = "auto",
    rng: np.random.Generator | int | None = None,
    n_draws: int = 199,
    title: str = "composite",
) -> TestResult:
    """Test H0: p = p(theta) for some theta, with the general minimum chi-square statistic.

    Parameters
    ----------
    hist : Histogram
        The sufficient statistic of the reports; public-coin one-bit reports are refused.
    model : ParametricModel
        The null family p(theta) with s free parameters (``IndependenceModel``,
        ``FunctionModel`` or a subclass); its k must be the question's.
    alpha : float, default 0.05
        Level of the test, in (0, 1).
    method : str, optional
        Randomized response ``min-chi-square``; Gaussian noise and flip components ``projected``
        (default) or ``nonprojected``; Laplace noise and the support-count mechanisms
        ``bootstrap``. None picks the default.
    calibration : {"auto", "asymptotic", "monte-carlo"}, default "auto"
        ``"asymptotic"``: chi-square with k - 1 - s degrees of freedom, or k - s non-projected;
        with additive noise inconclusive when a rough cell has n p <= 5. ``"monte-carlo"``:
        parametric bootstrap, ``n_draws`` replicates drawn at p(theta_hat), boundary fits
        included, each re-fitted. ``"auto"``: asymptotic only where the diagnostics of
        ``stats.calibration`` pass; Laplace noise is always bootstrapped.
    rng : numpy.random.Generator or int, optional
        Randomness of the bootstrap; a seed makes it reproducible.
    n_draws : int, default 199
        Number of bootstrap replicates.
    title : str, default "composite"
        Prefix of the result's ``method`` label.

    Returns
    -------
    TestResult
        With ``dof`` = k - 1 - s (projected) or k - s, None when bootstrapped; an
        ``inconclusive`` result never rejects and says why.

    Raises
    ------
    InvalidInputError
        A model that is not a ``ParametricModel``, has the wrong k or too many parameters, or
        whose p(theta_hat) is not a probability vector; the asymptotic law asked for a
        support-count mechanism; a malformed ``alpha``, ``method``, ``calibration``, ``rng`` or
        ``n_draws``; public-coin one-bit reports.
    InsufficientDataError
        A histogram of zero reports.

    References
    ----------
    [Rogers2017] Sec. 7.1.2 (minimum chi-square theory), Alg. 15 (GenChiTest), Alg. 16
    (MC-GenChiTest), Alg. 19 (LocalGeneral); [Kifer2017]; local-chi-square-tests spec §3.5,
    §3.7, §4.3, §4.6, §4.7.

    Examples
    --------
    Independence of two binary attributes, written as the composite null of a 2 x 2 table:

    >>> from aggregator.histogram import Histogram
    >>> from aggregator.stats import IndependenceModel, composite
    >>> from client.mechanisms import RandomizedResponse
    >>> hist = Histogram(RandomizedResponse(k=4, epsilon=2.0), 3000, [760, 735, 742, 763])
    >>> result = composite(hist, IndependenceModel(2, 2))
    >>> result.dof, result.reject, round(result.pvalue, 2)
    (1, False, 0.4)
    """
    hist = check_per_category(check_histogram(hist), "composite test")
    alpha = check_alpha(alpha)
    calibration = check_calibration(calibration)
    n_draws = check_draws(n_draws, alpha)
    mech = hist.mechanism
    if not isinstance(model, ParametricModel):
        raise InvalidInputError("model must be an aggregator.stats.ParametricModel")
    if model.k != mech.k:
        raise InvalidInputError(f"the model has {model.k} cells but the question has {mech.k}")
    kind = type(mech)
    method = check_method(method, COMPOSITE_METHODS[kind], mech.name)
    if is_support(mech) and calibration == "asymptotic":
        raise InvalidInputError(
            f"{mech.name}: a composite null is only calibrated by the bootstrap; "
            "use calibration='monte-carlo' or 'auto'"
        )
    projected = method != "nonprojected"
    n = hist.n
    dof = mech.k - model.n_params - (1 if projected else 0)
    if dof < 1:
        raise InvalidInputError(
            f"the model has too many parameters ({model.n_params}) for k={mech.k}"
        )

    fit = _fit(mech, model, hist.values[None, :], n, projected)
    _check_model_output(fit.fitted[0])
    statistic = check_finite_statistic(float(fit.statistic[0]))
    choice = choose(calibration, mech, n, fit.fitted[0], composite=True)
    sparse = np.min(n * fit.rough[0]) <= MIN_EXPECTED_CELL
    additive = mech.statistic_kind == "noise"
    if additive and sparse and calibration == "auto" and not choice.simulated:
        choice = Choice("monte-carlo", f"an estimated cell has n*p <= {MIN_EXPECTED_CELL:g}")
    common = CalibratedFields(
        method=f"{title}: {_LABELS[(kind, method)]}",
        n=n,
        alpha=alpha,
        expected=n * mech.report_mean(fit.fitted[0]),
        observed=hist.values.copy(),
        mechanism=mech.describe(),
        calibration=choice.calibration,
        calibration_reason=choice.reason,
    )
    if choice.simulated:
        draws = simulate_null(mech, n, fit.fitted[0], make_rng(rng), n_draws)
        null = _fit(mech, model, draws, n, projected).statistic
        pvalue = monte_carlo_pvalue(statistic, null)
        reject = pvalue <= alpha
        return TestResult(statistic, pvalue, None, reject=reject, n_draws=n_draws, **common)
    if additive and sparse:
        reason = f"an estimated cell has n*p <= {MIN_EXPECTED_CELL:g}"
        return TestResult(
            statistic, 1.0, dof, reject=False, inconclusive=True, reason=reason, **common
        )
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(statistic, pvalue, dof, reject=pvalue <= alpha, **common)


def _check_model_output(p: np.ndarray) -> None:
    """p(theta_hat) must be a probability vector, or the statistic means nothing."""
    if not np.isfinite(p).all():
        raise InvalidInputError("model: p(theta) is not finite at the fitted parameters")
    if p.min() < -1e-9 or abs(p.sum() - 1) > 1e-6:
        raise InvalidInputError(
            f"model: p(theta) must be a probability vector; at the fit it sums to {p.sum():.6g} "
            f"with smallest cell {p.min():.3g}"
        )


def independence(
    hist: Histogram,
    shape: tuple[int, int] | None = None,
    alpha: float = 0.05,
    method: str | None = None,
    *,
    calibration: str = "auto",
    rng: np.random.Generator | int | None = None,
    n_draws: int = 199,
) -> TestResult:
    """Test independence of the two attributes of a jointly randomized r x c question.

    Category ``i * c + j`` is row i, column j. Methods: randomized response ``min-chi-square``;
    Gaussian ``projected`` (default) or ``nonprojected``; Laplace ``bootstrap``; flip components
    ``projected`` (default) or ``nonprojected``; optimized unary encoding, Hadamard response,
    subset selection and local hashing ``bootstrap``. Degrees of freedom (r - 1)(c - 1);
    ``calibration`` as in ``composite``. Public-coin one-bit reports are refused.

    Parameters
    ----------
    hist : Histogram
        The sufficient statistic of the reports on the r * c joint categories.
    shape : tuple of int, optional
        ``(r, c)``, with r * c equal to the question's k; by default the table shape of the
        histogram's question (a histogram from ``aggregator.open_survey`` knows it).
    alpha : float, default 0.05
        Level of the test, in (0, 1).
    method : str, optional
        One of the methods above; None picks the mechanism's default.
    calibration : {"auto", "asymptotic", "monte-carlo"}, default "auto"
        As in ``composite``.
    rng : numpy.random.Generator or int, optional
        Randomness of a bootstrap; a seed makes it reproducible.
    n_draws : int, default 199
        Number of bootstrap replicates.

    Returns
    -------
    TestResult
        With ``dof`` = (r - 1)(c - 1), None when bootstrapped.

    Raises
    ------
    InvalidInputError
        A ``shape`` that is not a pair of integers or does not match k, no ``shape`` for a
        histogram whose question is unknown or not of two attributes, public-coin one-bit
        reports, or any input ``composite`` refuses.
    InsufficientDataError
        A histogram of zero reports.

    References
    ----------
    [Rogers2017] Alg. 10-13 (curator model, from [Gaboardi2016]), Alg. 15-16 and Alg. 19 (local
    model); local-chi-square-tests spec §3.4, §4.3, §4.6, §4.7; docs/flip-independence.md.

    Examples
    --------
    A 2 x 2 question (category ``i * 2 + j`` is row i, column j) randomized with epsilon = 2:

    >>> from aggregator.histogram import Histogram
    >>> from aggregator.stats import independence
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=4, epsilon=2.0)
    >>> independent = Histogram(rr, 3000, [760, 735, 742, 763])
    >>> independence(independent, (2, 2)).reject
    False
    >>> associated = Histogram(rr, 3000, [1000, 500, 500, 1000])
    >>> result = independence(associated, (2, 2))
    >>> result.dof, result.reject
    (1, True)
    """
    hist = check_per_category(check_histogram(hist), "independence test")
    if shape is None:
        shape = _table_shape(hist)
    try:
        r, c = shape
        if int(r) != r or int(c) != c:
            raise ValueError
        r, c = int(r), int(c)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"shape must be a pair of integers (r, c), got {shape!r}") from exc
    if r * c != hist.k:
        raise InvalidInputError(f"shape {r}x{c} does not match the question's {hist.k} categories")
    return composite(
        hist,
        IndependenceModel(r, c),
        alpha,
        method,
        calibration=calibration,
        rng=rng,
        n_draws=n_draws,
        title="independence",
    )


def _table_shape(hist: Histogram) -> tuple[int, int]:
    """The (rows, columns) of the histogram's question, or InvalidInputError saying why not."""
    question = hist.question
    if question is None:
        raise InvalidInputError(
            "independence needs shape=(r, c): this histogram does not carry its question "
            "(histograms from aggregator.open_survey do)"
        )
    if question.table_shape is None:
        raise InvalidInputError(
            f"question {question.id} has {len(question.attributes)} attribute(s); an "
            "independence test needs a question of two"
        )
    return question.table_shape
