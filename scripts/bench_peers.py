"""Side by side with peer LDP libraries: randomization throughput and frequency-estimation error
of k-ary randomized response (k-RR) and symmetric unary encoding (SUE) in ldp-survey, pure-ldp and
multi-freq-ldpy, in one process and on identical true answers.

Usage: python scripts/bench_peers.py [--quick] [--out docs/peers-table.md] [--venv DIR]
       python scripts/bench_peers.py --large-domain [--quick] (issue 17: OUE, OLH, HR, SS)

The peers are not dependencies of ldp-survey. Unless they are importable already, the script
creates a benchmark virtual environment (``.bench-venv`` at the repository root, or --venv),
installs this checkout and the pinned peer versions into it, and re-executes itself there.

What is matched with what:
* k-RR: our ``RandomizedResponse`` = pure-ldp ``DEClient``/``DEServer`` (direct encoding) =
  multi-freq-ldpy ``GRR_Client``; keep probability e^eps / (e^eps + k - 1) in all three.
* SUE: our ``FlipComponents`` = pure-ldp ``UEClient(use_oue=False)`` = multi-freq-ldpy
  ``UE_Client(optimal=False)``; every bit is kept with probability e^(eps/2) / (e^(eps/2) + 1).
  The peers' optimized variant (OUE) has another law and is not compared.
* Estimators: ours (``aggregator.stats.estimate``) and pure-ldp's are the same unbiased
  de-biasing, so their MSE must agree with each other and with the exact variance.
  multi-freq-ldpy's ``*_Aggregator_MI`` clips negative estimates to 0 and renormalises; it is
  compared with the same post-processing applied to our unbiased estimate.
* Large domains (``--large-domain``): our ``OptimizedUnaryEncoding`` = pure-ldp
  ``UEClient(use_oue=True)`` = multi-freq-ldpy ``UE_Client(optimal=True)``; our ``LocalHashing``
  = pure-ldp ``LHClient(use_olh=True)`` = multi-freq-ldpy ``LH_Client(optimal=True)`` (their
  g = round(e^eps) + 1 and xxhash32, ours ceil(e^eps) + 1 and a SHA-256-keyed polynomial); our
  ``HadamardResponse`` = pure-ldp ``HadamardResponseClient`` (at eps <= 1 its high-privacy
  variant); our ``SubsetSelection`` = multi-freq-ldpy ``SS_Client`` (their d = rint(k/(e^eps+1)),
  ours the ceiling). Compared: reports per second of one-report randomization, and the time to
  turn n reports into frequency estimates (ours from the wire payloads, theirs from their own
  report objects; the peers have no batch path). pure-ldp's RAPPOR is left out: its client never
  flips a true 1 to 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from peer_venv import ensure_venv

ROOT = Path(__file__).resolve().parents[1]
PEER_PINS = ("pure-ldp==1.2.0", "multi-freq-ldpy==0.2.5")
# pure_ldp.frequency_oracles imports these at package import time without declaring them.
# Both peers' local hashing hash str(value) with xxhash, which xxhash >= 2 refuses (bytes only).
PEER_UNDECLARED = ("scikit-learn", "statsmodels", "xxhash<2")
NEEDED_MODULES = (
    "numpy",
    "scipy",
    "pure_ldp",
    "multi_freq_ldpy",
    "numba",
    "sklearn",
    "statsmodels",
    "tqdm",  # ldp-survey's own dependency (progress bars): an older bench venv is updated
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark ldp-survey against pure-ldp and multi-freq-ldpy on identical inputs."
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test, ~1 min)")
    parser.add_argument("--out", type=Path, metavar="PATH", help="also write the tables here")
    parser.add_argument(
        "--venv",
        type=Path,
        default=ROOT / ".bench-venv",
        help="benchmark venv (default: %(default)s)",
    )
    parser.add_argument(
        "--large-domain", action="store_true", help="OUE, OLH, HR, SS instead (issue 17)"
    )
    return parser.parse_args()


if __name__ == "__main__":
    ensure_venv(
        "bench_peers",
        parse_args().venv,
        NEEDED_MODULES,
        ["-e", str(ROOT), *PEER_PINS, *PEER_UNDECLARED],
    )

import datetime
import importlib.metadata
import math
import os
import platform
import random
import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np
from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Aggregator_MI, GRR_Client
from multi_freq_ldpy.pure_frequency_oracles.LH import LH_Aggregator_MI, LH_Client
from multi_freq_ldpy.pure_frequency_oracles.SS import SS_Aggregator_MI, SS_Client
from multi_freq_ldpy.pure_frequency_oracles.UE import UE_Aggregator_MI, UE_Client
from pure_ldp.frequency_oracles.direct_encoding import DEClient, DEServer
from pure_ldp.frequency_oracles.hadamard_response import (
    HadamardResponseClient,
    HadamardResponseServer,
)
from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer
from pure_ldp.frequency_oracles.unary_encoding import UEClient, UEServer

sys.path.insert(0, str(ROOT))

from privacy_audit import SeededSource  # Mersenne Twister bytes: NOT secure, diagnostic only

from aggregator.histogram import Histogram
from aggregator.stats import estimate
from client.cli.progress import track
from client.mechanisms import (
    FlipComponents,
    HadamardResponse,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    RandomizedResponse,
    SubsetSelection,
)

SEED = 20261121
KS = (4, 64, 1024)
EPSILONS = (0.5, 1.0, 4.0)
RR, SUE = "k-RR", "SUE"
OURS, PURE, MFL = "ldp-survey", "pure-ldp", "multi-freq-ldpy"
Z_AGREE = 3.0  # |z| above this marks a disagreement worth a look


@dataclass(frozen=True)
class Sizes:
    """Workload of one run: per-report loop lengths, batch sizes, MSE runs and reports per run."""

    per_report: dict[tuple[str, int], int]
    batch_rr: int  # answers per batch call of our k-RR simulator
    batch_sue_bits: int  # answers x k per batch call of our SUE simulator
    repeats: int
    runs: int
    n: int


FULL = Sizes(
    per_report={
        (RR, 4): 20_000,
        (RR, 64): 20_000,
        (RR, 1024): 20_000,
        (SUE, 4): 10_000,
        (SUE, 64): 4_000,
        (SUE, 1024): 1_000,
    },
    batch_rr=10_000_000,
    batch_sue_bits=20_000_000,
    repeats=5,
    runs=50,
    n=10_000,
)
QUICK = Sizes(
    per_report={key: count // 10 for key, count in FULL.per_report.items()},
    batch_rr=1_000_000,
    batch_sue_bits=2_000_000,
    repeats=3,
    runs=5,
    n=2_000,
)


# --- inputs ------------------------------------------------------------------------------------


def true_answers(k: int, size: int) -> np.ndarray:
    """Answers drawn once per k from a Zipf(1) law over the k categories (fixed seed)."""
    weights = 1.0 / np.arange(1, k + 1)
    return np.random.default_rng([SEED, k]).choice(k, size=size, p=weights / weights.sum())


def ours(kind: str, k: int, eps: float) -> Mechanism:
    return RandomizedResponse(k, eps) if kind == RR else FlipComponents(k, eps)


def keep_and_lie(kind: str, k: int, eps: float) -> tuple[float, float]:
    """(p, q): P(report says j | answer j) and P(report says j | answer not j), per category."""
    if kind == RR:
        return math.exp(eps) / (math.exp(eps) + k - 1), 1 / (math.exp(eps) + k - 1)
    return math.exp(eps / 2) / (math.exp(eps / 2) + 1), 1 / (math.exp(eps / 2) + 1)


@numba.njit
def seed_numba(seed: int) -> None:
    """multi-freq-ldpy draws inside numba, whose generator only a jitted call can seed."""
    np.random.seed(seed)


def seed_peers(*key: object) -> None:
    """Seed every generator the peers use, from the benchmark seed and ``key``."""
    seed = zlib.crc32(repr((SEED, *key)).encode())
    random.seed(seed)
    np.random.seed(seed)
    seed_numba(seed)


def identity(x: int) -> int:
    return x


# --- throughput ----------------------------------------------------------------------------------


def per_report_rate(fn: Callable, tail: tuple, values: list[int], repeats: int) -> float:
    """Reports/s of ``fn(v, *tail)`` over ``values`` (median of ``repeats`` passes, after a
    warm-up call that also triggers numba compilation). Every library goes through this same
    loop, so loop and call overheads are equal."""
    fn(values[0], *tail)
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for v in values:
            fn(v, *tail)
        passes.append(time.perf_counter() - start)
    return len(values) / statistics.median(passes)


def batch_rate(mech: Mechanism, values: np.ndarray, repeats: int) -> float:
    """Reports/s of our vectorized simulator (median of ``repeats`` calls after one warm-up)."""
    rng = np.random.default_rng(SEED)
    mech.simulate(values, rng)
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        mech.simulate(values, rng)
        passes.append(time.perf_counter() - start)
    return values.size / statistics.median(passes)


def per_report_randomizers(kind: str, k: int, eps: float) -> dict[str, tuple[Callable, tuple]]:
    """Each library's single-report randomizer as (function, arguments after the answer)."""
    mech = ours(kind, k, eps)
    if kind == RR:
        pure, mfl = DEClient(eps, k, index_mapper=identity), (GRR_Client, (k, eps))
    else:
        pure = UEClient(eps, k, use_oue=False, index_mapper=identity)
        mfl = (UE_Client, (k, eps, False))
    return {
        f"{OURS} secure": (mech.randomize, ()),
        f"{OURS} MT bytes (diagnostic)": (mech.randomize, (SeededSource(SEED),)),
        PURE: (pure.privatise, ()),
        MFL: mfl,
    }


@dataclass(frozen=True)
class Throughput:
    kind: str
    k: int
    eps: float
    per_report: dict[str, float]
    batch: float


def measure_throughput(kind: str, k: int, eps: float, sizes: Sizes) -> Throughput:
    count = sizes.per_report[(kind, k)]
    values = [int(v) for v in true_answers(k, count)]
    rates = {}
    for label, (fn, tail) in per_report_randomizers(kind, k, eps).items():
        seed_peers(kind, k, eps, label)
        rates[label] = per_report_rate(fn, tail, values, sizes.repeats)
    batch_values = true_answers(k, sizes.batch_rr if kind == RR else sizes.batch_sue_bits // k)
    return Throughput(kind, k, eps, rates, batch_rate(ours(kind, k, eps), batch_values, 3))


# --- estimation error ----------------------------------------------------------------------------


def clip_renormalise(freqs: np.ndarray) -> np.ndarray:
    """multi-freq-ldpy's post-processing: negative estimates to 0, then rescale to sum 1."""
    clipped = np.clip(freqs, 0.0, None)
    return clipped / clipped.sum() if clipped.sum() > 0 else clipped


def ours_estimates(
    kind: str, k: int, eps: float, values: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    mech = ours(kind, k, eps)
    return estimate(Histogram.from_reports(mech, mech.simulate(values, rng))).frequencies


def pure_estimates(kind: str, k: int, eps: float, values: list[int]) -> np.ndarray:
    if kind == RR:
        client, server = DEClient(eps, k, identity), DEServer(eps, k, identity)
    else:
        client = UEClient(eps, k, use_oue=False, index_mapper=identity)
        server = UEServer(eps, k, use_oue=False, index_mapper=identity)
    for v in values:
        server.aggregate(client.privatise(v))
    return np.asarray(server.estimate_all(range(k), suppress_warnings=True)) / len(values)


def mfl_estimates(kind: str, k: int, eps: float, values: list[int]) -> np.ndarray:
    if kind == RR:
        return GRR_Aggregator_MI([GRR_Client(v, k, eps) for v in values], k, eps)
    return UE_Aggregator_MI([UE_Client(v, k, eps, False) for v in values], eps, False)


@dataclass(frozen=True)
class Mse:
    """Mean over runs of the per-run MSE (mean over categories), with its standard error."""

    mean: float
    se: float

    @classmethod
    def of(cls, per_run: list[float]) -> Mse:
        runs = np.asarray(per_run)
        return cls(float(runs.mean()), float(runs.std(ddof=1) / math.sqrt(runs.size)))

    def z_against(self, other: Mse | float) -> float:
        """Standardised difference from another estimate (both SEs) or an exact value."""
        if isinstance(other, Mse):
            return (self.mean - other.mean) / math.hypot(self.se, other.se)
        return (self.mean - other) / self.se


@dataclass(frozen=True)
class Accuracy:
    kind: str
    k: int
    eps: float
    exact: float
    unbiased: dict[str, Mse]  # ours and pure-ldp
    clipped: dict[str, Mse]  # multi-freq-ldpy MI and ours + the same post-processing


def exact_mse(kind: str, k: int, eps: float, values: np.ndarray) -> float:
    """Exact MSE of the unbiased estimator given these answers: category j is reported by each
    of its n_j holders with probability p and by each other user with probability q, so
    Var(f_j) = (n_j p(1-p) + (n - n_j) q(1-q)) / (n (p - q))^2; the MSE averages over j."""
    p, q = keep_and_lie(kind, k, eps)
    n = values.size
    holders = np.bincount(values, minlength=k)
    variance = (holders * p * (1 - p) + (n - holders) * q * (1 - q)) / (n * (p - q)) ** 2
    return float(variance.mean())


def measure_accuracy(kind: str, k: int, eps: float, sizes: Sizes) -> Accuracy:
    values = true_answers(k, sizes.n)
    as_list = [int(v) for v in values]
    truth = np.bincount(values, minlength=k) / values.size
    rng = np.random.default_rng([SEED, k, int(eps * 100), kind == SUE])
    seed_peers(kind, k, eps, "accuracy")
    errors: dict[str, list[float]] = {label: [] for label in ("ours", "pure", "mfl", "ours+")}
    for _ in range(sizes.runs):
        mine = ours_estimates(kind, k, eps, values, rng)
        errors["ours"].append(float(np.mean((mine - truth) ** 2)))
        errors["ours+"].append(float(np.mean((clip_renormalise(mine) - truth) ** 2)))
        errors["pure"].append(float(np.mean((pure_estimates(kind, k, eps, as_list) - truth) ** 2)))
        errors["mfl"].append(float(np.mean((mfl_estimates(kind, k, eps, as_list) - truth) ** 2)))
    return Accuracy(
        kind,
        k,
        eps,
        exact_mse(kind, k, eps, values),
        {OURS: Mse.of(errors["ours"]), PURE: Mse.of(errors["pure"])},
        {MFL: Mse.of(errors["mfl"]), f"{OURS} + clip": Mse.of(errors["ours+"])},
    )


# --- report --------------------------------------------------------------------------------------


def rate_text(rate: float) -> str:
    return f"{rate / 1e6:.2f} M" if rate >= 1e6 else f"{rate / 1e3:.1f} k"


def mse_text(mse: Mse) -> str:
    return f"{mse.mean:.3e} ± {mse.se:.1e}"


def z_text(z: float) -> str:
    return f"{z:+.1f}" + ("" if abs(z) <= Z_AGREE else " **!**")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def throughput_tables(results: list[Throughput]) -> list[str]:
    labels = list(results[0].per_report)
    secure, diagnostic = labels[0], labels[1]
    rows = []
    for r in results:
        rates = r.per_report
        rows.append(
            [r.kind, str(r.k), f"{r.eps:g}", *(rate_text(rates[lab]) for lab in labels)]
            + [f"{rates[secure] / rates[peer]:.2f}×" for peer in (PURE, MFL)]
            + [f"{rates[diagnostic] / rates[peer]:.2f}×" for peer in (PURE, MFL)]
        )
    per_report = table(
        [
            "mech",
            "k",
            "ε",
            *(f"{lab} (rep/s)" for lab in labels),
            f"secure / {PURE}",
            f"secure / {MFL}",
            f"MT / {PURE}",
            f"MT / {MFL}",
        ],
        rows,
    )
    batch_rows = [
        [r.kind, str(r.k), f"{r.eps:g}", rate_text(r.batch)]
        + [f"{r.batch / r.per_report[peer]:.0f}×" for peer in (PURE, MFL)]
        for r in results
    ]
    batch = table(
        [
            "mech",
            "k",
            "ε",
            f"{OURS} `simulate` (rep/s)",
            f"÷ {PURE} per-report",
            f"÷ {MFL} per-report",
        ],
        batch_rows,
    )
    return [
        "### Randomization throughput, one report per call",
        "",
        "Ratios are our rate / the peer's rate. *secure*: `mechanism.randomize` on the OS CSPRNG "
        "(what devices run). *MT bytes*: the same code fed Mersenne Twister bytes (diagnostic, "
        "not secure), the generator the peers use.",
        "",
        *per_report,
        "",
        "### Batch randomization",
        "",
        "Neither peer has a batch randomizer: simulating n users means calling the per-report "
        "function n times, so our vectorized `simulate` (numpy, seeded, not for devices) is "
        "compared with that loop.",
        "",
        *batch,
    ]


def accuracy_tables(results: list[Accuracy]) -> list[str]:
    rows = []
    for r in results:
        mine, pure = r.unbiased[OURS], r.unbiased[PURE]
        mfl, mine_clipped = r.clipped[MFL], r.clipped[f"{OURS} + clip"]
        rows.append(
            [
                r.kind,
                str(r.k),
                f"{r.eps:g}",
                f"{r.exact:.3e}",
                mse_text(mine),
                z_text(mine.z_against(r.exact)),
                mse_text(pure),
                z_text(pure.z_against(r.exact)),
                z_text(mine.z_against(pure)),
                mse_text(mfl),
                mse_text(mine_clipped),
                z_text(mine_clipped.z_against(mfl)),
            ]
        )
    header = [
        "mech",
        "k",
        "ε",
        "exact MSE",
        f"{OURS}",
        "z vs exact",
        f"{PURE}",
        "z vs exact",
        "z ours − pure",
        f"{MFL} MI (clip)",
        f"{OURS} + clip",
        "z ours − mfl",
    ]
    return [
        "### Frequency-estimation error (MSE over runs, ± standard error)",
        "",
        *table(header, rows),
    ]


def environment(sizes: Sizes, started: str, load: str) -> list[str]:
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("pure-ldp", "multi-freq-ldpy", "numba", "numpy")
    )
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        cpu = models[0].split(":", 1)[1].strip() if models else cpu
    loops = ", ".join(f"{kind} k={k}: {count:,}" for (kind, k), count in sizes.per_report.items())
    return [
        f"Command: `python scripts/bench_peers.py{' --quick' if sizes is QUICK else ''}`, "
        f"started {started}. Machine: {platform.platform()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {versions}. Load average at start: {load}.",
        "",
        f"Per-report loops: {loops} reports, median of {sizes.repeats} passes. "
        f"Accuracy: {sizes.runs} runs of n = "
        f"{sizes.n:,} reports on one fixed set of Zipf(1) answers per k (seed {SEED}); "
        f"|z| > {Z_AGREE:g} is marked **!**.",
    ]


# --- large domains (issue 17) --------------------------------------------------------------------

LARGE_KS, LARGE_EPSILON = (64, 1024), 1.0


def large_domain_pairs(kind: str, k: int, eps: float) -> tuple[Mechanism, dict]:
    """Our mechanism and each peer's (client, decoder) for one mechanism kind: the client
    randomizes one answer, the decoder turns a list of client outputs into frequencies."""
    if kind == "OUE":
        pure_server = UEServer(eps, k, use_oue=True, index_mapper=identity)
        peers = {
            PURE: (
                UEClient(eps, k, use_oue=True, index_mapper=identity).privatise,
                lambda reports, s=pure_server: _pure_decode(s, reports, k),
            ),
            MFL: (
                lambda v: UE_Client(v, k, eps, True),
                lambda reports: UE_Aggregator_MI(reports, eps, True),
            ),
        }
        return OptimizedUnaryEncoding(k, eps), peers
    if kind == "OLH":
        g = round(math.exp(eps)) + 1
        pure_server = LHServer(eps, k, g, use_olh=True, index_mapper=identity)
        peers = {
            PURE: (
                LHClient(eps, k, g, use_olh=True, index_mapper=identity).privatise,
                lambda reports, s=pure_server: _pure_decode(s, reports, k),
            ),
            MFL: (
                lambda v: LH_Client(v, k, eps, True),
                lambda reports: LH_Aggregator_MI(reports, k, eps, True),
            ),
        }
        return LocalHashing(k, eps), peers
    if kind == "HR":
        pure_server = HadamardResponseServer(eps, k, index_mapper=identity)
        client = HadamardResponseClient(eps, k, pure_server.get_hash_funcs(), identity)
        peers = {PURE: (client.privatise, lambda r, s=pure_server: _pure_decode(s, r, k))}
        return HadamardResponse(k, eps), peers
    peers = {
        MFL: (lambda v: SS_Client(v, k, eps), lambda reports: SS_Aggregator_MI(reports, k, eps))
    }
    return SubsetSelection(k, eps), peers


def _pure_decode(server, reports: list, k: int) -> np.ndarray:
    server.reset()
    for report in reports:
        server.aggregate(report)
    return np.asarray(server.estimate_all(range(k), suppress_warnings=True))


def ours_decode(mech: Mechanism, packed: np.ndarray) -> np.ndarray:
    """Wire payloads (n, payload_size) -> de-biased frequencies, as the service does it."""
    counts = mech.support_counts(mech.decode_many(packed))  # type: ignore[attr-defined]
    return (counts / packed.shape[0] - mech.offset) / mech.slope


@dataclass(frozen=True)
class LargeRow:
    kind: str
    k: int
    randomize: dict[str, float]  # reports per second, one report per call
    decode: dict[str, float]  # seconds for n reports


def measure_large(kind: str, k: int, sizes: Sizes) -> LargeRow:
    eps = LARGE_EPSILON
    mech, peers = large_domain_pairs(kind, k, eps)
    count = max(200, sizes.per_report[(SUE, 64)] // 4)
    values = [int(v) for v in true_answers(k, count)]
    rates = {f"{OURS} secure": per_report_rate(mech.randomize, (), values, sizes.repeats)}
    for label, (client, _) in peers.items():
        seed_peers(kind, k, label)
        rates[label] = per_report_rate(client, (), values, sizes.repeats)
    n = sizes.n * 5
    answers = true_answers(k, n)
    rng = np.random.default_rng([SEED, k])
    payloads = b"".join(mech.encode(r) for r in mech.simulate(answers, rng))
    packed = np.frombuffer(payloads, dtype=np.uint8).reshape(n, mech.payload_size)
    decode = {OURS: _seconds(lambda: ours_decode(mech, packed))}
    for label, (client, decoder) in peers.items():
        seed_peers(kind, k, label, "decode")
        reports = [client(int(v)) for v in answers]
        decode[label] = _seconds(lambda d=decoder, r=reports: d(r))
    return LargeRow(kind, k, rates, decode)


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def large_domain_tables(rows: list[LargeRow], n: int) -> list[str]:
    body = []
    for r in rows:
        for label in (f"{OURS} secure", PURE, MFL):
            peer = label.split(" ")[0]
            if label not in r.randomize:
                continue
            seconds = r.decode[peer]
            body.append(
                [r.kind, str(r.k), label, rate_text(r.randomize[label]), f"{1000 * seconds:.1f}"]
            )
    return [
        f"### Large domains, ε = {LARGE_EPSILON:g}: randomization and decoding of n = {n:,} "
        "reports",
        "",
        "Randomization: one report per call, reports/s (ours through the secure CSPRNG path). "
        "Decoding: wall time from n reports to the k frequency estimates (ours from the wire "
        "payloads with the service's decoder; the peers from their own report objects).",
        "",
        *table(["mech", "k", "library", "randomize (rep/s)", f"decode n={n:,} (ms)"], body),
    ]


def main_large(sizes: Sizes) -> None:
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    clock = time.perf_counter()
    rows = []
    for kind in ("OUE", "OLH", "HR", "SS"):
        for k in LARGE_KS:
            print(f"large domain {kind} k={k}", file=sys.stderr)
            rows.append(measure_large(kind, k, sizes))
    elapsed = time.perf_counter() - clock
    lines = [
        f"Command: `python scripts/bench_peers.py --large-domain"
        f"{' --quick' if sizes is QUICK else ''}`, started {started}; load average {load}.",
        "",
        *large_domain_tables(rows, sizes.n * 5),
        "",
        f"Total time: {elapsed:.0f} s.",
    ]
    print("\n".join(lines))


def main() -> None:
    args = parse_args()
    if args.large_domain:
        main_large(QUICK if args.quick else FULL)
        return
    sizes = QUICK if args.quick else FULL
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    clock = time.perf_counter()
    configs = [(kind, k, eps) for kind in (RR, SUE) for k in KS for eps in EPSILONS]
    speed, accuracy = [], []
    for kind, k, eps in track(configs, "throughput", unit="settings"):
        speed.append(measure_throughput(kind, k, eps, sizes))
    for kind, k, eps in track(configs, "accuracy", unit="settings"):
        accuracy.append(measure_accuracy(kind, k, eps, sizes))
    elapsed = time.perf_counter() - clock
    lines = [
        *environment(sizes, started, load),
        "",
        *throughput_tables(speed),
        "",
        *accuracy_tables(accuracy),
        "",
        f"Total time: {elapsed:.0f} s.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
