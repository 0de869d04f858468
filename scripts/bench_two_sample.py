"""Two-sample tests side by side with ``privateab`` (Mun, Kwak, Kim 2024, PyPI ``privateAB``):
Type I error, power at equal n and time per test, on privateab's own settings.

Usage: python scripts/bench_two_sample.py [--quick] [--trials N] [--out docs/two-sample.md]
[--venv DIR]; ``--recheck N --seed S`` reruns only our tests' Type I cells (N trials, seed S; no
privateab, no table), to settle a cell near the edge of the band.

privateab needs PyTorch and is not a dependency of ldp-survey. Unless it is importable already,
the script creates its own virtual environment (``.bench-privateab-venv`` at the repository root,
or --venv), installs the pinned privateab into it, and re-executes itself there with this
checkout on ``sys.path`` (our statistics need only numpy and scipy, which privateab brings).

What is matched with what (privateab README, "Basic usage"):
* privateab ``genrr`` + ``server_multinomial_genrr`` (the paper's Chi statistic, permutation
  p-value) against our ``RandomizedResponse`` + ``two_sample`` (homogeneity chi-square, permutation
  of the pooled privatized counts): the same k-RR law and, in the limit, the same statistic.
* privateab ``bitflip`` + ``server_multinomial_bitflip`` (ProjChi, permutation p-value) against
  our ``FlipComponents`` + ``two_sample`` (projected chi-square, parametric bootstrap): both flip
  every bit with probability 1 / (e^(eps/2) + 1).
* Settings: privateab's perturbed uniform pair (``privateAB.utils.get_uniform_perturb``: uniform
  plus alternating +-bump, group A's vector shifted by one cell) with its README's k = 4,
  bump 0.04, eps = 0.9, n = 1,000 per group, and k = 40, bump 0.01, eps = 2, n = 2,000. Type I
  draws both groups from group A's vector. m = B = 199 null draws / permutations on both sides.
* Each library randomizes the same raw answers with its own client. Time is the test alone
  (privateab: loading the privatized reports into its server and its permutations; ours:
  aggregating the reports and ``two_sample``), one thread.
* Compatibility shim: privateab 0.0.2 calls ``torch.cholesky``, removed from current PyTorch;
  the script maps it to ``torch.linalg.cholesky`` (same lower factor).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from peer_venv import ensure_venv

ROOT = Path(__file__).resolve().parents[1]
PEER_PIN = "privateAB==0.0.2"
NEEDED_MODULES = ("numpy", "scipy", "torch", "privateAB")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Two-sample tests against privateab.")
    parser.add_argument("--quick", action="store_true", help="30 trials per cell (~1-2 min)")
    parser.add_argument("--trials", type=int, help="trials per cell (default 100; quick: 30)")
    parser.add_argument("--out", type=Path, help="also write the table into this Markdown file")
    parser.add_argument("--recheck", type=int, metavar="N", help="only our Type I, N trials")
    parser.add_argument("--seed", type=int, default=2026, help="seed of --recheck")
    parser.add_argument(
        "--venv",
        type=Path,
        default=ROOT / ".bench-privateab-venv",
        help="benchmark venv (default: %(default)s)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    ensure_venv("bench_two_sample", parse_args().venv, NEEDED_MODULES, [PEER_PIN])

import datetime  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(ROOT))

from doc_sections import write_section  # noqa: E402

from aggregator.histogram import Histogram  # noqa: E402
from aggregator.stats import two_sample  # noqa: E402
from aggregator.stats.studies import RejectionRate  # noqa: E402
from client.mechanisms import FlipComponents, RandomizedResponse  # noqa: E402


def _cholesky(matrix, upper=False):
    """``torch.cholesky`` as privateab 0.0.2 calls it, on a PyTorch that removed it."""
    lower = torch.linalg.cholesky(matrix)
    return lower.mH if upper else lower


try:
    torch.cholesky(torch.eye(1))
except (AttributeError, RuntimeError):
    torch.cholesky = _cholesky

import privateAB.client  # noqa: E402
from privateAB.server import server_multinomial_bitflip, server_multinomial_genrr  # noqa: E402
from privateAB.utils import get_uniform_perturb  # noqa: E402

ALPHA = 0.05
DRAWS = 199
START, END = "<!-- privateab:start -->", "<!-- privateab:end -->"
SETTINGS = [  # (label, k, bump, eps, n per group)
    ("README: k = 4, bump 0.04, eps = 0.9", 4, 0.04, 0.9, 1000),
    ("k = 40, bump 0.01, eps = 2", 40, 0.01, 2.0, 2000),
]
PAIRS = [  # (privateab mechanism, its server, its statistic, our mechanism class)
    ("genrr", server_multinomial_genrr, "Chi", RandomizedResponse),
    ("bitflip", server_multinomial_bitflip, "ProjChi", FlipComponents),
]


def run_cell(k, bump, eps, n, pair, alternative: bool, trials: int, seed: int):
    """(privateab rejections, our rejections, privateab s/test, our s/test)."""
    name, server_class, _, mechanism_class = pair
    p_a, p_b = (t.double().numpy() for t in get_uniform_perturb(k, bump))
    p_b = p_b if alternative else p_a
    p_a, p_b = p_a / p_a.sum(), p_b / p_b.sum()
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    peer_client = privateAB.client.client()
    mech = mechanism_class(k, eps)
    peer, ours, peer_time, our_time = 0, 0, 0.0, 0.0
    for _ in range(trials):
        x, y = rng.choice(k, size=n, p=p_a), rng.choice(k, size=n, p=p_b)
        peer_a = peer_client.release_private(name, torch.from_numpy(x), k, eps, "cpu")
        peer_b = peer_client.release_private(name, torch.from_numpy(y), k, eps, "cpu")
        started = time.perf_counter()
        server = server_class(eps)
        server.load_private_data_multinomial(peer_a, peer_b, k, "cpu", "cpu")
        pvalue, _ = server.release_p_value_permutation(DRAWS)
        peer_time += time.perf_counter() - started
        peer += pvalue <= ALPHA
        reports_a, reports_b = mech.simulate(x, rng), mech.simulate(y, rng)
        started = time.perf_counter()
        result = two_sample(
            Histogram.from_reports(mech, reports_a),
            Histogram.from_reports(mech, reports_b),
            ALPHA,
            calibration="monte-carlo",
            rng=rng,
            n_draws=DRAWS,
        )
        our_time += time.perf_counter() - started
        ours += result.reject
    return peer, ours, peer_time / trials, our_time / trials


def our_null_rate(k, bump, eps, n, mechanism_class, trials: int, seed: int) -> RejectionRate:
    """Type I of our test alone, exactly as in ``run_cell`` (per-device randomizers, m = 199)."""
    p_a = get_uniform_perturb(k, bump)[0].double().numpy()
    p_a = p_a / p_a.sum()
    rng = np.random.default_rng(seed)
    mech = mechanism_class(k, eps)
    rejections = 0
    for _ in range(trials):
        groups = [rng.choice(k, size=n, p=p_a) for _ in range(2)]
        hist_a, hist_b = (Histogram.from_reports(mech, mech.simulate(x, rng)) for x in groups)
        result = two_sample(
            hist_a, hist_b, ALPHA, calibration="monte-carlo", rng=rng, n_draws=DRAWS
        )
        rejections += result.reject
    return RejectionRate(int(rejections), trials)


def recheck(trials: int, seed: int) -> None:
    for label, k, bump, eps, n in SETTINGS:
        for _, _, _, mechanism_class in PAIRS:
            rate = our_null_rate(k, bump, eps, n, mechanism_class, trials, seed)
            band = "inside" if rate.within_band(ALPHA) else "OUTSIDE"
            print(
                f"{label}, n = {n:,}: {mechanism_class.name} Type I {rate.rejections} of "
                f"{trials} = {rate.rate:.4f} ({band} the 99% band; seed {seed})",
                flush=True,
            )


def rate_text(count: int, trials: int, null: bool) -> str:
    rate = RejectionRate(int(count), trials)
    mark = " *" if null and not rate.within_band(ALPHA) else ""
    return f"{rate.rate:.3f}{mark}"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    if args.recheck:
        recheck(args.recheck, args.seed)
        return
    trials = args.trials or (30 if args.quick else 100)
    started = time.time()
    rows = []
    for label, k, bump, eps, n in SETTINGS:
        for pair in PAIRS:
            cells = [
                run_cell(k, bump, eps, n, pair, alternative, trials, seed=k * 7 + int(10 * eps))
                for alternative in (False, True)
            ]
            (peer0, ours0, peer_t, our_t), (peer1, ours1, peer_t1, our_t1) = cells
            rows.append(
                f"| {label}, n = {n:,} per group | {pair[0]} + {pair[2]} / "
                f"{pair[3].name} + two_sample | {rate_text(peer0, trials, True)} / "
                f"{rate_text(ours0, trials, True)} | {rate_text(peer1, trials, False)} / "
                f"{rate_text(ours1, trials, False)} | {1000 * (peer_t + peer_t1) / 2:.1f} / "
                f"{1000 * (our_t + our_t1) / 2:.2f} |"
            )
            print(rows[-1], flush=True)
    elapsed = time.time() - started
    command = "python scripts/bench_two_sample.py" + (" --quick" if args.quick else "")
    command += f" --trials {args.trials}" if args.trials else ""
    lines = [
        START,
        f"Generated by `{command}` on {datetime.date.today()} ({platform.machine()}, Python "
        f"{platform.python_version()}, privateAB 0.0.2, torch {torch.__version__}, one thread, "
        f"{trials} trials per cell, m = B = {DRAWS}, alpha = {ALPHA}; {elapsed / 60:.1f} min on a "
        "2-core VM shared with other jobs). Each cell: privateab / ldp-survey. `*` marks a "
        "Type I rate outside the 99% binomial band around 0.05.",
        "",
        "| setting | tests (privateab / ours) | Type I | power | ms per test |",
        "|---|---|---|---|---|",
        *rows,
        END,
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_section(args.out, text)


if __name__ == "__main__":
    main()
