"""Stratified two-stage cluster samples for studies of the design-based statistics
(survey-design-and-monitoring spec D.4): strata sampled out of proportion to their population
shares (unequal weights, and a naive estimate biased whenever the strata differ), PSUs whose
answers share a Dirichlet draw around their stratum's distribution (intra-cluster correlation
``1 / (concentration + 1)``; infinite: none), and a random weight factor per PSU on top, which
may be informative: correlated with the PSU's share of a category, so that the weights matter
within a stratum too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import integrate, stats

from aggregator.stats.design.cells import Design, contributions, indicators
from client.mechanisms import Mechanism


@dataclass(frozen=True)
class DesignSample:
    """One sample: true answers, per-report contributions and the design."""

    answers: np.ndarray
    x_hat: np.ndarray
    design: Design


@dataclass(frozen=True)
class TwoStageSetting:
    """A superpopulation and a sampling plan: per stratum h its population share and answer
    distribution; ``psus`` PSUs per stratum of about ``psu_size`` reports each (uniform in
    [size/2, 3 size/2]); ``weight_spread`` the log-normal sd of a PSU's weight factor, whose log
    has correlation ``informative`` with the PSU's standardized share of category
    ``informative_category`` (large weights, rarely sampled PSUs, hold more of it)."""

    shares: tuple[float, ...]
    distributions: tuple[tuple[float, ...], ...]
    psus: int
    psu_size: int
    concentration: float
    weight_spread: float = 0.0
    informative: float = 0.0
    informative_category: int = 1

    @property
    def k(self) -> int:
        return len(self.distributions[0])

    def population_distribution(self) -> np.ndarray:
        """The target: the answer distribution of the whole population. A PSU of weight factor
        f stands for f PSUs like it, so each stratum's is ``E[f theta] / E[f]`` over the PSUs'
        shared distributions theta: its own distribution unless the weights are informative."""
        shares = np.asarray(self.shares) / np.sum(self.shares)
        return shares @ np.stack([self._stratum_population(pi) for pi in self.distributions])

    def _stratum_population(self, distribution: tuple[float, ...]) -> np.ndarray:
        """``E[f theta] / E[f]`` by quadrature over the informative category's Beta marginal
        (given it, the other categories share the rest in proportion, and the weight factor's
        independent part cancels)."""
        pi = np.asarray(distribution, dtype=float)
        j = self.informative_category
        if self.informative == 0 or np.isinf(self.concentration) or pi[j] in (0.0, 1.0):
            return pi
        a, b = self.concentration * pi[j], self.concentration * (1 - pi[j])
        marginal = stats.beta(a, b)
        centre, scale = marginal.mean(), marginal.std()

        def moment(power: int) -> float:
            def integrand(t: float) -> float:
                tilt = np.exp(self.weight_spread * self.informative * (t - centre) / scale)
                return float(tilt * t**power * marginal.pdf(t))

            return float(integrate.quad(integrand, 0.0, 1.0, limit=200)[0])

        mass, first = moment(0), moment(1)
        share = first / mass
        out = pi * (1 - share) / (1 - pi[j])
        out[j] = share
        return out

    def sample(self, mechanism: Mechanism | None, rng: np.random.Generator) -> DesignSample:
        """Draw a sample and privatize it (``mechanism`` None: answers seen directly)."""
        strata, clusters, weights, answers = [], [], [], []
        allocation = 1.0 / len(self.shares)
        for h, (share, pi) in enumerate(zip(self.shares, self.distributions, strict=True)):
            for c in range(self.psus):
                size = int(rng.integers(self.psu_size // 2, 3 * self.psu_size // 2 + 1))
                shared = (
                    np.asarray(pi)
                    if np.isinf(self.concentration)
                    else rng.dirichlet(self.concentration * np.asarray(pi))
                )
                answers.append(rng.choice(self.k, size=size, p=shared))
                factor = np.exp(self.weight_spread * self._weight_score(shared, pi, rng))
                strata.append(np.full(size, h))
                clusters.append(np.full(size, c))
                weights.append(np.full(size, factor * share / allocation))
        x = np.concatenate(answers)
        x_hat = (
            indicators(x, self.k)
            if mechanism is None
            else contributions(mechanism, mechanism.simulate(x, rng))
        )
        design = Design(np.concatenate(strata), np.concatenate(clusters), np.concatenate(weights))
        return DesignSample(x, x_hat, design)

    def _weight_score(
        self, shared: np.ndarray, distribution: tuple[float, ...], rng: np.random.Generator
    ) -> float:
        """A standard normal score for the PSU's log weight factor, correlated ``informative``
        with its standardized share of the informative category."""
        noise = float(rng.standard_normal())
        if self.informative == 0 or np.isinf(self.concentration):
            return noise
        p = distribution[self.informative_category]
        spread = np.sqrt(p * (1 - p) / (self.concentration + 1))
        z = (shared[self.informative_category] - p) / spread if spread > 0 else 0.0
        return float(self.informative * z + np.sqrt(1 - self.informative**2) * noise)
