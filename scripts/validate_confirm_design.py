"""The confirmatory family's Type I on a clustered, weighted design (issue 36 item 7): what
``confirm`` seals for a survey with a sampling design, design-based by default, beside the same
plan run as a simple random sample (``design = false``).

The survey is a household survey like the one measured from outside: 3 districts (strata) of
population shares 0.5, 0.3, 0.2, 12 villages (PSUs) each with equal allocation, so weights
differ across districts; districts answer differently, and villages share a Dirichlet draw
around their district's distribution (intra-cluster correlation 1 / (concentration + 1)). The
plan is two tests whose nulls hold in the population: goodness of fit of a 4-category question
(randomized response) against its population distribution, and independence of a 2 x 2
question. The family is run by ``aggregator.confirm.run.sealed_record`` exactly as ``confirm``
runs it (Holm at family-wise alpha 0.05), on per design key statistics and histograms built as
the store keeps them (one design key per village and weight class).

Usage: python scripts/validate_confirm_design.py [--trials N] [--seed S] [--epsilon E]
(default 800 trials at epsilon 2: about a minute on one core). docs/validation.md's table:
``--trials 2000``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.analysis.design_data import side_design_data
from aggregator.confirm.plan import parse_plan
from aggregator.confirm.run import sealed_record
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.ingest import histogram
from aggregator.survey_file.config import load_surveys

SHARES = (0.5, 0.3, 0.2)
PSUS = 12
PSU_SIZE = 25
UNIFORM = np.full(4, 0.25)
SHIFT = np.array([0.06, 0.02, -0.02, -0.06])
#: per district: mood distributions whose population mixture is uniform
MOOD = (UNIFORM + SHIFT, UNIFORM - SHARES[0] / SHARES[1] * SHIFT, UNIFORM)
#: per district: the 2 x 2 question's margins (independent within every district)
PAIR = ((0.3, 0.6), (0.5, 0.4), (0.7, 0.5))
SURVEY = """
[[survey]]
id = "household"
min_batch_size = 50
design = {{ table = "frame.csv" }}

[[survey.question]]
id = "mood"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = {epsilon}

[[survey.question]]
id = "pair"
mechanism = "randomized_response"
epsilon = {epsilon}
attributes = [
    {{ name = "x", categories = ["x0", "x1"] }},
    {{ name = "y", categories = ["y0", "y1"] }},
]
"""
PLAN = """survey = "household"

[[test]]
question = "mood"
test = "goodness_of_fit"
p0 = "uniform"

[[test]]
question = "pair"
test = "independence"
"""


def frame_rows() -> list[tuple[str, str, str, float]]:
    """(key, stratum, psu, weight): one key per village; weight = share / allocation x 12."""
    return [
        (f"d{h}v{c}", f"d{h}", f"d{h}v{c}", 12.0 * share / (1 / len(SHARES)))
        for h, share in enumerate(SHARES)
        for c in range(PSUS)
    ]


def write_survey(root: Path, epsilon: float) -> None:
    rows = ["key,stratum,psu,weight"] + [",".join(map(str, row)) for row in frame_rows()]
    (root / "frame.csv").write_text("\n".join(rows) + "\n")
    (root / "surveys.toml").write_text(SURVEY.format(epsilon=epsilon))


def pair_distribution(h: int) -> np.ndarray:
    x, y = PAIR[h]
    return np.outer([1 - x, x], [1 - y, y]).ravel()


def one_sample(survey, concentration: float, rng: np.random.Generator):
    """The histograms and per key statistics of one survey sample, as a store holds them."""
    histograms, designs = {}, {}
    for question in survey.questions:
        mech = question.mechanism
        keys, counts = [], []
        for key, stratum, _, _ in frame_rows():
            h = int(stratum[1:])
            center = MOOD[h] if question.id == "mood" else pair_distribution(h)
            shared = rng.dirichlet(concentration * center)
            size = int(rng.integers(PSU_SIZE // 2, 3 * PSU_SIZE // 2 + 1))
            reports = mech.simulate(rng.choice(mech.k, size=size, p=shared), rng)
            keys.append(key)
            counts.append(np.bincount(reports, minlength=mech.k).astype(np.int64))
        designs[question.id] = [
            KeyStatistics("", key, int(c.sum()), c, c.astype(np.float64))
            for key, c in zip(keys, counts, strict=True)
        ]
        total = np.sum(counts, axis=0)
        histograms[question.id, ""] = histogram(question, int(total.sum()), total)
    return histograms, designs


def run(trials: int, seed: int, epsilon: float, concentration: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        write_survey(Path(tmp), epsilon)
        surveys = load_surveys(Path(tmp) / "surveys.toml")
    survey = surveys["household"]
    designed = parse_plan(PLAN, surveys)
    simple = parse_plan(PLAN.replace('p0 = "uniform"', 'p0 = "uniform"\ndesign = false')
                        .replace('test = "independence"', 'test = "independence"\ndesign = false'),
                        surveys)  # fmt: skip
    rng = np.random.default_rng(seed)
    rejected = {"design-based": 0, "as a simple random sample": 0}
    for _ in range(trials):
        histograms, stats_by_question = one_sample(survey, concentration, rng)
        designs = side_design_data(survey, stats_by_question)
        for name, plan in (("design-based", designed), ("as a simple random sample", simple)):
            record = sealed_record(plan, survey, histograms, 0, designs)
            rejected[name] += any(result["reject"] for result in record["results"])
    return {name: count / trials for name, count in rejected.items()}


def band(trials: int, alpha: float = 0.05) -> tuple[float, float]:
    low, high = stats.binom.ppf([0.005, 0.995], trials, alpha)
    return low / trials, high / trials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=800)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--concentration", type=float, default=9.0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rates = run(args.trials, args.seed, args.epsilon, args.concentration)
    low, high = band(args.trials)
    icc = 1 / (args.concentration + 1)
    print(
        f"confirmatory family (Holm, 2 tests, alpha 0.05), 3 strata x {PSUS} PSUs, weights "
        f"{min(r[3] for r in frame_rows()):g}-{max(r[3] for r in frame_rows()):g}, ICC {icc:.2f},"
        f" epsilon {args.epsilon:g}, {args.trials} trials; 99% band [{low:.3f}, {high:.3f}]"
    )
    print("| family run | family-wise Type I |")
    print("|---|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.3f} |")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
