"""Scale benchmark of the Beam aggregation job (docs/performance.md, "Scale-out (Beam)").

For each size n it simulates n randomized reports over three questions (randomized response,
flip components, Gaussian noise) with the mechanisms' numpy ``simulate``, writes them as a shard
directory exactly like ``ldp-aggregator export`` (not timed), runs the job on the DirectRunner
(default: 2 workers, multi_processing) and times it end to end, checks the job's counts against
the simulated ones, and prints n, seconds, reports/s and a least-squares line t = a + b n.

Smoke run:  python scripts/bench_scale.py --sizes 1e5 1e6
Full run:   python scripts/bench_scale.py            (1e5 .. 1e7; needs ~2 GB of free disk)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from aggregator.jobs import inputs, pipeline
from aggregator.jobs.results import Analysis
from aggregator.store import shards
from client.cli.progress import bar
from client.mechanisms import FlipComponents, RandomizedResponse
from client.survey import Attribute, SurveySpec, build_question
from protos.ldp.v1 import ldp_pb2

SURVEY = SurveySpec(
    "bench",
    "scale benchmark",
    (
        build_question("rr", "", [Attribute("rr", tuple(f"c{i}" for i in range(8)))],
                       "randomized_response", 1.0),
        build_question("fc", "", [Attribute("fc", tuple(f"c{i}" for i in range(8)))],
                       "flip_components", 1.0),
        build_question("gauss", "", [Attribute("gauss", ("a", "b", "c", "d"))], "gaussian", 0.5),
    ),
    min_batch_size=1000,
)  # fmt: skip
CHUNK = 500_000  # reports simulated and written per step (bounds memory)


def payload_matrix(mechanism, reports: np.ndarray) -> np.ndarray:
    """The wire payloads of many reports as a (m, payload_size) uint8 matrix (= encode)."""
    if isinstance(mechanism, RandomizedResponse):
        return reports.astype("<u4").view(np.uint8).reshape(len(reports), 4)
    if isinstance(mechanism, FlipComponents):
        return np.packbits(reports.astype(np.uint8), axis=1, bitorder="little")
    return np.ascontiguousarray(reports, dtype="<i8").view(np.uint8).reshape(len(reports), -1)


def records(question, ids: np.ndarray, payloads: np.ndarray) -> np.ndarray:
    """Length-prefixed canonical ``ldp.v1.Report`` records as a (m, 1 + length) matrix."""
    template = ldp_pb2.Report(
        report_id=bytes(16),
        survey_id=SURVEY.id,
        question_id=question.id,
        payload=bytes(question.mechanism.payload_size),
    ).SerializeToString()
    assert len(template) < 0x80, "one-byte length prefix"
    out = np.empty((len(ids), 1 + len(template)), dtype=np.uint8)
    out[:, 0] = len(template)
    out[:, 1:] = np.frombuffer(template, dtype=np.uint8)
    out[:, 3:19] = ids
    out[:, out.shape[1] - payloads.shape[1] :] = payloads
    return out


def write_shards(n: int, count: int, out: Path, rng: np.random.Generator) -> dict:
    """Simulate n reports, spread over the questions, into ``count`` shards; return the true
    per-question (n, sums) the job must find."""
    out.mkdir(parents=True)
    names = [shards.shard_name(SURVEY.id, i, count) for i in range(count)]
    files = [open(out / name, "wb") for name in names]  # noqa: SIM115 - closed below
    written = [0] * count
    expected = {q.id: [0, np.zeros(q.k, dtype=np.int64)] for q in SURVEY.questions}
    try:
        for file in files:
            file.write(shards.HEADER)
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            which = rng.integers(len(SURVEY.questions), size=m)
            parts, shard_of = [], []
            for index, question in enumerate(SURVEY.questions):
                mech = question.mechanism
                size = int((which == index).sum())
                reports = mech.simulate(rng.integers(mech.k, size=size), rng)
                payloads = payload_matrix(mech, reports)
                if size:
                    assert payloads[0].tobytes() == mech.encode(reports[0])
                    expected[question.id][0] += size
                    expected[question.id][1] += _sums(mech, reports)
                ids = rng.integers(0, 256, size=(size, 16), dtype=np.uint8)
                parts.append(records(question, ids, payloads))
                shard_of.append(ids[:, :8].copy().view("<u8").reshape(-1) % count)
            for shard, file in enumerate(files):
                rows = [p[s == shard] for p, s in zip(parts, shard_of, strict=True)]
                file.write(_interleave(rows, rng))
                written[shard] += sum(len(r) for r in rows)
    finally:
        for file in files:
            file.close()
    shards.write_manifest(out, SURVEY, list(zip(names, written, strict=True)))
    return {q: (int(v[0]), v[1].tolist()) for q, v in expected.items()}


def _sums(mechanism, reports: np.ndarray) -> np.ndarray:
    if isinstance(mechanism, RandomizedResponse):
        return np.bincount(reports, minlength=mechanism.k)
    return reports.sum(axis=0, dtype=np.int64)


def _interleave(rows: list[np.ndarray], rng: np.random.Generator) -> bytes:
    """Records of different lengths in a random order, as one byte string."""
    lengths = np.concatenate([np.full(len(r), r.shape[1]) for r in rows])
    order = rng.permutation(lengths.size)
    offsets = np.empty(lengths.size, dtype=np.int64)
    offsets[order] = np.concatenate([[0], np.cumsum(lengths[order])[:-1]])
    flat = np.empty(int(lengths.sum()), dtype=np.uint8)
    first = 0
    for r in rows:
        mine = offsets[first : first + len(r)]
        flat[mine[:, None] + np.arange(r.shape[1])] = r
        first += len(r)
    return flat.tobytes()


def run_job(directory: Path, workers: int, mode: str) -> tuple[float, dict]:
    found = inputs.resolve([str(directory)], {SURVEY.id: SURVEY})
    spec = pipeline.JobSpec(
        {SURVEY.id: SURVEY}, found.shards, str(directory / "results.json"), Analysis()
    )
    options = [
        "--runner=DirectRunner",
        f"--direct_num_workers={workers}",
        f"--direct_running_mode={mode}",
        "--default_sdk_harness_log_level=ERROR",
    ]
    start = time.perf_counter()
    document = pipeline.run(spec, options)
    seconds = time.perf_counter() - start
    return seconds, {r["question"]: (r["n"], r["sums"]) for r in document["results"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e5, 3e5, 1e6, 3e6, 1e7])
    parser.add_argument("--shards", type=int, default=8, help="shard files per run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", default="multi_processing", help="direct_running_mode")
    parser.add_argument("--dir", type=Path, help="where to write shards (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.dir))
    rng = np.random.default_rng(args.seed)
    rows = []
    total = sum(int(size) for size in args.sizes)
    try:
        with bar(total, "scale", unit="reports") as progress:
            for size in args.sizes:
                n = int(size)
                directory = base / f"n{n}"
                expected = write_shards(n, args.shards, directory, rng)
                seconds, found = run_job(directory, args.workers, args.mode)
                if found != expected:
                    print(
                        f"MISMATCH at n={n}: job {found} != simulated {expected}", file=sys.stderr
                    )
                    return 1
                rows.append((n, seconds))
                rate = n / seconds
                progress.write(
                    f"{n:>12,d}  {seconds:8.2f} s  {rate:>12,.0f} reports/s  (counts exact)"
                )
                progress.update(n)
                shutil.rmtree(directory)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(rows, args)
    return 0


def report(rows: list[tuple[int, float]], args: argparse.Namespace) -> None:
    """The table and the straight-line fit t = a + b n (linear growth: small residuals)."""
    print(f"\nDirectRunner, {args.workers} worker(s), {args.mode}, {args.shards} shards per run")
    print(f"{'n':>12}  {'seconds':>8}  {'reports/s':>12}")
    for n, seconds in rows:
        print(f"{n:>12,d}  {seconds:8.2f}  {n / seconds:>12,.0f}")
    if len(rows) >= 2:
        n, t = np.array(rows, dtype=float).T
        b, a = np.polyfit(n, t, 1)
        residual = np.abs(t - (a + b * n)) / t
        print(
            f"fit: t = {a:.2f} s + n x {b * 1e6:.3f} s per million reports "
            f"(marginal {1 / b:,.0f} reports/s); max relative residual {residual.max():.1%}"
        )
        if n.max() >= 1e7:
            largest = t[n.argmax()]
            verdict = "met" if largest < 60 else "NOT met"
            print(f"n = 1e7: {largest:.1f} s (target < 60 s: {verdict})")


if __name__ == "__main__":
    sys.exit(main())
