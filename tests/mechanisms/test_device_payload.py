"""The device's single-record path (``Mechanism.randomize_payload``, pure Python): the bytes a
device sends are those of ``encode(randomize())`` for the same random bytes, every conformance
vector is reproduced through it, each mechanism's reports follow its exact channel, and a device
that answers and uploads never loads numpy (docs/performance.md, "Device footprint")."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from client.device.selftest import ReplayRandom, build_mechanism
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
)
from client.mechanisms.local_hashing import HASH_DOMAIN, PRIME
from client.mechanisms.public_coin import in_public_subset
from client.mechanisms.secure_random import SecureRandom

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "protos" / "ldp" / "v1" / "testvectors.json").read_text())
P_MIN = 1e-3  # chi-square p-values below this fail (fixed seeds: a pass is reproducible)


class SeededSource(SecureRandom):
    """Bytes from a seeded PRNG, counted (tests only: never for real answers)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(seed)
        self.used = 0

    def bytes(self, count: int) -> bytes:
        self.used += count
        return self._rng.randbytes(count)


MECHANISMS: list[Mechanism] = [
    RandomizedResponse(2, 1.0),
    RandomizedResponse(7, 0.3),
    FlipComponents(3, 1.0),
    FlipComponents(9, 2.0),  # a second payload byte, padding bits
    OptimizedUnaryEncoding(3, 1.0),
    OptimizedUnaryEncoding(64, 1.0),  # the bit order of issue 26
    HadamardResponse(5, 1.0),
    SubsetSelection(5, 1.0),
    SubsetSelection(12, 0.5),
    LocalHashing(6, 1.0),
    PublicCoinBit(6, 1.0, 2**64 - 1, 4),
    PublicCoinBit(9, 0.7, 12345, 3),
    GaussianNoise(3, 0.5, granularity_bits=0),
    GaussianNoise(2, 2.0),
    LaplaceNoise(3, 1.0, granularity_bits=0),
    LaplaceNoise(2, 0.5),
]


@pytest.mark.parametrize("vector", VECTORS["reports"], ids=lambda v: v["mechanism"])
def test_every_vector_through_the_device_path(vector):
    """The recorded random bytes give the recorded payload, and are all read."""
    mech = build_mechanism(vector["mechanism"], vector["params"])
    source = ReplayRandom(bytes.fromhex(vector["random_hex"]))
    assert mech.randomize_payload(vector["answer"], source).hex() == vector["payload_hex"]
    assert source.remaining == 0


@pytest.mark.parametrize("mech", MECHANISMS, ids=Mechanism.describe)
def test_the_device_path_sends_the_bytes_of_the_numpy_path(mech):
    """Same random bytes, same payload and the same number of bytes read, for every answer."""
    for value, seed in itertools.product(range(min(mech.k, 12)), range(15)):
        device, reference = SeededSource(seed), SeededSource(seed)
        payload = mech.randomize_payload(value, device)
        assert payload == mech.encode(mech.randomize(value, reference)), (value, seed)
        assert device.used == reference.used and len(payload) == mech.payload_size


def _draws(mech: Mechanism, value: int, n: int, seed: int) -> list[bytes]:
    source = SeededSource(seed)
    return [mech.randomize_payload(value, source) for _ in range(n)]


def _assert_law(observed: np.ndarray, probabilities: np.ndarray) -> None:
    """Pearson's chi-square of counts against an exact law (every cell expected >= 5)."""
    probabilities = np.asarray(probabilities, dtype=float)
    expected = observed.sum() * probabilities / probabilities.sum()
    assert expected.min() >= 5, expected
    assert stats.chisquare(observed, expected).pvalue > P_MIN


def _channel(mech: Mechanism, x: int) -> np.ndarray:
    """P(report category j | answer x), or P(bit j = 1 | x): the mechanism's channel."""
    return mech.report_mean(np.eye(mech.k)[x])


def test_randomized_response_law():
    mech, x = RandomizedResponse(4, 1.0), 2
    reports = [mech.decode(p) for p in _draws(mech, x, 20_000, seed=1)]
    _assert_law(np.bincount(reports, minlength=4), _channel(mech, x))


def test_the_law_check_sees_a_wrong_epsilon():
    """Control: the same draws fail against the channel of epsilon 1.15 instead of 1."""
    mech, x = RandomizedResponse(4, 1.0), 2
    reports = [mech.decode(p) for p in _draws(mech, x, 20_000, seed=1)]
    with pytest.raises(AssertionError):
        _assert_law(np.bincount(reports, minlength=4), _channel(RandomizedResponse(4, 1.15), x))


@pytest.mark.parametrize("mech", [FlipComponents(3, 1.0), OptimizedUnaryEncoding(3, 1.0)])
def test_unary_bits_law(mech):
    """All 2^k bit patterns against the product of the per-bit Bernoulli laws (independence)."""
    x = 1
    patterns = [int(mech.decode(p) @ (1 << np.arange(3))) for p in _draws(mech, x, 20_000, 2)]
    one = _channel(mech, x)
    law = [
        math.prod(one[j] if pattern >> j & 1 else 1 - one[j] for j in range(3))
        for pattern in range(8)
    ]
    _assert_law(np.bincount(patterns, minlength=8), np.array(law))


def test_hadamard_column_law():
    mech, x = HadamardResponse(5, 1.0), 3
    columns = [mech.decode(p) for p in _draws(mech, x, 20_000, seed=3)]
    law = mech.column_distribution(np.eye(5)[x])
    _assert_law(np.bincount(columns, minlength=mech.columns), law)


def test_subset_selection_law():
    """Every d-subset with the answer has probability a / C(k-1, d-1), every other one
    (1 - a) / C(k-1, d)."""
    mech, x = SubsetSelection(5, 1.0), 0
    d, a = mech.subset_size, mech.in_probability
    subsets = list(itertools.combinations(range(5), d))
    index = {s: i for i, s in enumerate(subsets)}
    observed = np.zeros(len(subsets))
    for payload in _draws(mech, x, 20_000, seed=4):
        observed[index[tuple(np.flatnonzero(mech.decode(payload)))]] += 1
    law = [a / math.comb(4, d - 1) if x in s else (1 - a) / math.comb(4, d) for s in subsets]
    _assert_law(observed, np.array(law))


def test_local_hashing_law():
    """Seeds uniform (their top 4 bits); the sent value is the seed's hash of the answer with
    the inner randomized response's keep probability, else uniform among the g - 1 others."""
    mech, x = LocalHashing(6, 1.0), 4
    g, inner = mech.buckets, mech.inner
    shifts, tops = np.zeros(g), np.zeros(16)
    for payload in _draws(mech, x, 20_000, seed=5):
        seed, value = (int(v) for v in mech.decode(payload))
        digest = hashlib.sha256(HASH_DOMAIN + seed.to_bytes(8, "little")).digest()
        c2, c1, c0 = (int.from_bytes(digest[i : i + 8], "little") % PRIME for i in (0, 8, 16))
        hashed = (c2 * x * x + c1 * x + c0) % PRIME % g
        shifts[(value - hashed) % g] += 1
        tops[seed >> 60] += 1
    _assert_law(shifts, np.array([inner.a0 + inner.a1] + [inner.a0] * (g - 1)))
    _assert_law(tops, np.ones(16))


def test_public_coin_law():
    """Groups uniform, and the bit says the truth about the group's public subset with
    probability rho; the subsets are read from the bulk construction (``subset_masks``)."""
    mech, x = PublicCoinBit(6, 1.0, 2**64 - 1, 4), 1
    observed = np.zeros((4, 2))
    for payload in _draws(mech, x, 20_000, seed=6):
        group, bit = (int(v) for v in mech.decode(payload))
        observed[group, int(bit == mech.subset_masks[group, x])] += 1
    rho = mech.keep_probability
    _assert_law(observed.ravel(), np.array([1 - rho, rho] * 4))


@pytest.mark.parametrize(("k", "seed", "groups"), [(2, 0, 3), (7, 99, 5), (40, 2**64 - 1, 2)])
def test_public_subset_membership_is_the_bulk_construction(k, seed, groups):
    masks = PublicCoinBit(k, 1.0, seed, groups).subset_masks
    for group, value in itertools.product(range(groups), range(k)):
        assert in_public_subset(k, seed, group, value) == masks[group, value]


def _pmf(weights: dict[int, float], edges: range) -> np.ndarray:
    """The law of binned values: below the first edge, each edge, above the last."""
    total = sum(weights.values())
    low = sum(w for z, w in weights.items() if z < edges[0])
    high = sum(w for z, w in weights.items() if z > edges[-1])
    return np.array([low, *(weights.get(z, 0.0) for z in edges), high]) / total


def _binned(values: list[int], edges: range) -> np.ndarray:
    clipped = np.clip(values, edges[0] - 1, edges[-1] + 1) - (edges[0] - 1)
    return np.bincount(clipped, minlength=len(edges) + 2)


@pytest.mark.parametrize(
    ("mech", "edges"),
    [
        (GaussianNoise(2, 0.5, granularity_bits=0), range(-3, 4)),
        (LaplaceNoise(2, 1.0, granularity_bits=0), range(-5, 6)),
    ],
)
def test_additive_noise_law(mech, edges):
    """Each coordinate minus g e_x is exact discrete noise: N_Z(0, 1/rho), P(z) ~ exp(-z^2 rho
    / 2), or the discrete Laplace, P(z) ~ exp(-|z| eps / 2), on the unit grid."""
    x = 1
    noise = []
    for payload in _draws(mech, x, 5_000, seed=7):
        grid = mech.decode(payload)
        grid[x] -= mech.scale
        noise += grid.tolist()
    if isinstance(mech, GaussianNoise):
        weights = {z: math.exp(-z * z * mech.rho / 2) for z in range(-60, 61)}
    else:
        weights = {z: math.exp(-abs(z) * mech.epsilon / 2) for z in range(-200, 201)}
    _assert_law(_binned(noise, edges), _pmf(weights, edges))


# --- a device never loads numpy ------------------------------------------------------------------


def _run(code: str, absent: tuple[str, ...] = ("numpy",)) -> None:
    """Run ``code`` in a fresh interpreter, then check it loaded none of ``absent``."""
    check = f"\nloaded = sorted(set({absent!r}) & set(sys.modules))\nassert not loaded, loaded\n"
    done = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code + check],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_every_mechanism_randomizes_without_numpy():
    """Built from each vector's parameters, every mechanism randomizes and encodes one answer,
    and the self-check replays every vector, with numpy never imported."""
    _run(
        "import json\n"
        "from client.device import selftest\n"
        "for v in json.loads(selftest.VECTORS_PATH.read_text())['reports']:\n"
        "    selftest.build_mechanism(v['mechanism'], v['params']).randomize_payload(v['answer'])\n"
        "assert selftest.run().ok\n"
    )


def test_a_device_answers_and_uploads_without_numpy(server, tmp_path):
    """Through the library (every mechanism of the test survey) and through ``ldp-client
    submit``: each report accepted by a real aggregator, numpy never imported (nor, by the
    command line, shutil with its bz2 and lzma)."""
    _run(
        "from client.device.ledger import Budget\n"
        "from client.device.reporter import Reporter\n"
        "from client.device.transport import Transport\n"
        f"reporter = Reporter(Transport({server.target!r}), {str(tmp_path / 'lib')!r},"
        " Budget(30.0, pointwise=20.0))\n"
        "for question in ('rr', 'fc', 'gauss', 'lap', 'joint'):\n"
        "    reporter.answer_index('s1', question, 1)\n"
        "result = reporter.flush()\n"
        "reporter.close()\n"
        "assert (result.accepted, result.pending, result.error) == (5, 0, ''), result\n"
    )
    argv = [
        "submit",
        "--server",
        server.target,
        "--insecure",
        "--state",
        str(tmp_path / "cli"),
        "--budget",
        "5",
        "--survey",
        "s1",
        "--question",
        "fc",
        "--answer",
        "c",
        "--json",
    ]
    _run(
        "import contextlib, io, json\n"
        "from client.cli.main import main\n"
        "out = io.StringIO()\n"
        f"with contextlib.redirect_stdout(out):\n    assert main({argv!r}) == 0\n"
        "assert json.loads(out.getvalue())['flush']['accepted'] == 1\n",
        absent=("numpy", "shutil", "bz2", "lzma"),
    )
