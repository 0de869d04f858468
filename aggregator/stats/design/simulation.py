"""Stratified two-stage cluster samples for studies of the design-based statistics
(survey-design-and-monitoring spec D.4): strata sampled out of proportion to their population
shares (unequal weights, and a naive estimate biased whenever the strata differ), PSUs whose
answers share a Dirichlet draw around their stratum's distribution (intra-cluster correlation
``1 / (concentration + 1)``; infinite: none), and a random weight factor per PSU on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    [size/2, 3 size/2]); ``weight_spread`` the log-normal sd of a PSU's weight factor."""

    shares: tuple[float, ...]
    distributions: tuple[tuple[float, ...], ...]
    psus: int
    psu_size: int
    concentration: float
    weight_spread: float = 0.0

    @property
    def k(self) -> int:
        return len(self.distributions[0])

    def population_distribution(self) -> np.ndarray:
        """The target: the answer distribution of the whole population."""
        shares = np.asarray(self.shares) / np.sum(self.shares)
        return shares @ np.asarray(self.distributions)

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
                factor = np.exp(self.weight_spread * rng.standard_normal())
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
