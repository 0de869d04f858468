"""Demo of the statistical engine: simulated devices randomize their answers locally, and the
aggregator estimates the distribution and tests hypotheses from the randomized reports only."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit, independence
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    LaplaceNoise,
    RandomizedResponse,
)


def main() -> None:
    rng = np.random.default_rng(2026)
    n = 20_000
    truth = np.array([0.4, 0.3, 0.2, 0.1])
    answers = rng.choice(4, size=n, p=truth)
    print(f"{n} simulated devices; true answer distribution {truth.tolist()}\n")
    for mech in (
        RandomizedResponse(4, 1.0),
        FlipComponents(4, 1.0),
        GaussianNoise(4, 0.5),
        LaplaceNoise(4, 1.0),
    ):
        hist = Histogram.from_reports(mech, mech.simulate(answers, rng))
        print(estimate(hist).summary())
        print(goodness_of_fit(hist, truth, rng=rng).summary())
        print(goodness_of_fit(hist, np.full(4, 0.25), rng=rng).summary(), "\n")

    table = np.outer([0.6, 0.4], [0.5, 0.3, 0.2]).ravel()
    joint = rng.choice(6, size=n, p=table)
    mech = RandomizedResponse(6, 2.0)
    hist = Histogram.from_reports(mech, mech.simulate(joint, rng))
    print("Two attributes (2 x 3), independent in truth:")
    print(independence(hist, (2, 3)).summary())


if __name__ == "__main__":
    main()
