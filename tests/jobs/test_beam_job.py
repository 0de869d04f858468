"""The Apache Beam aggregation job on the DirectRunner: its counts equal the single-machine
store's exactly for every mechanism, its estimates and tests equal `ldp-aggregator estimate/test`
(also with 2 workers in multi_processing mode), overlapping exports count each report once, and
the shard framing's fast path always agrees with a sequential parse."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "apache_beam", reason="needs the [beam] extra: pip install -e '.[aggregator,dev,beam]'"
)

from aggregator.cli import main as aggregator_main
from aggregator.jobs import inputs, pipeline
from aggregator.jobs.framing import _split_sequential, iter_blocks, split_records
from aggregator.jobs.records import classify
from aggregator.jobs.results import Analysis
from aggregator.store import ingest, shards
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2
from tests.conftest import SURVEYS_TOML

SEED = 11
TRUE_P = {  # true answer distributions of survey s1 (not uniform, so some tests reject)
    "rr": [0.4, 0.3, 0.2, 0.1],
    "fc": [0.2, 0.2, 0.2, 0.2, 0.2],
    "gauss": [0.1, 0.2, 0.3, 0.4],
    "lap": [0.25, 0.25, 0.25, 0.25],
    "joint": [0.1, 0.2, 0.1, 0.2, 0.3, 0.1],
}
P0 = {q: ",".join(str(round(1 / len(p), 12)) for _ in p) for q, p in TRUE_P.items()}


def reports(surveys, per_question: int, rng: np.random.Generator) -> list[ldp_pb2.Report]:
    """Randomized reports of every s1 question, with random 16-byte ids."""
    out = []
    for question in surveys["s1"].questions:
        mech = question.mechanism
        values = rng.choice(mech.k, size=per_question, p=TRUE_P[question.id])
        for report in mech.simulate(values, rng):
            out.append(
                ldp_pb2.Report(
                    report_id=rng.bytes(16),
                    survey_id="s1",
                    question_id=question.id,
                    payload=mech.encode(report),
                )
            )
    return out


def store_with(db: Path, surveys, messages: list[ldp_pb2.Report]) -> None:
    with ReportStore(db) as store:
        for question in surveys["s1"].questions:
            store.register_question("s1", question.id, question.k)
        store.put(ingest.validate_batch(messages, surveys))


def export(db: Path, surveys, out: Path, count: int) -> Path:
    with ReportStore(db) as store:
        shards.export_survey(store, surveys["s1"], out, count)
    return out


def store_statistics(db: Path, surveys) -> dict[str, tuple[int, list[int]]]:
    with ReportStore(db) as store:
        return {
            q.id: (int(n), sums.tolist())
            for q in surveys["s1"].questions
            for n, sums in [store.statistics("s1", q.id)]
        }


def run_in_process(surveys, sources: list[str], out: Path, dedup: bool = False) -> dict:
    found = inputs.resolve(sources, surveys)
    spec = pipeline.JobSpec(
        surveys, found.shards, str(out), Analysis(seed=SEED), 8 if dedup else 0, block_bytes=4096
    )
    document = pipeline.run(spec, ["--runner=DirectRunner"])
    return {r["question"]: r for r in document["results"] if r["survey"] == "s1"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A real store of 1,500 reports per s1 question (5 mechanisms), exported as 4 shards."""
    base = tmp_path_factory.mktemp("beam")
    config = base / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    surveys = load_surveys(config)
    messages = reports(surveys, 1500, np.random.default_rng(SEED))
    store_with(base / "store.sqlite", surveys, messages)
    out = export(base / "store.sqlite", surveys, base / "shards", 4)
    return base, config, surveys, messages, out


@pytest.mark.slow
def test_counts_equal_the_store_exactly_for_every_mechanism(exported, tmp_path):
    base, _, surveys, _, out = exported
    results = run_in_process(surveys, [str(out)], tmp_path / "results.json")
    expected = store_statistics(base / "store.sqlite", surveys)
    assert set(results) == set(expected)  # survey "big" is in no input, so it is left out
    for question_id, (n, sums) in expected.items():
        assert n == 1500
        assert (results[question_id]["n"], results[question_id]["sums"]) == (n, sums)
        assert results[question_id]["released"] and results[question_id]["duplicates_dropped"] == 0


def service_json(config: Path, db: Path, capsys, *args: str) -> dict:
    capsys.readouterr()
    assert aggregator_main([*args, "--config", str(config), "--db", str(db), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def assert_same(job: dict, service: dict) -> None:
    assert job.keys() == service.keys()
    for key, value in service.items():
        if isinstance(value, float) or (isinstance(value, list) and value):
            np.testing.assert_allclose(job[key], value, rtol=1e-12, atol=1e-12)
        else:
            assert job[key] == value, key


@pytest.mark.slow
def test_cli_with_two_workers_equals_the_service(exported, tmp_path, capsys):
    base, config, _, _, out = exported
    result_file = tmp_path / "results.json"
    command = [
        *(sys.executable, "-m", "aggregator.cli", "job", "--surveys", str(config)),
        *("--shards", str(out), "--out", str(result_file), "--seed", str(SEED)),
        *(arg for q in TRUE_P for arg in ("--gof", f"{q}={P0[q]}")),
        *("--direct-num-workers", "2", "--direct-running-mode", "multi_processing"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "s1/joint: n = 1500, released" in done.stdout
    results = {r["question"]: r for r in json.loads(result_file.read_text())["results"]}
    db = base / "store.sqlite"
    for question_id in TRUE_P:
        where = ("--survey", "s1", "--question", question_id)
        estimate = service_json(config, db, capsys, "estimate", *where)
        assert estimate.pop("labels") == results[question_id]["labels"]
        assert estimate.pop("question") == question_id
        assert_same(results[question_id]["estimate"], estimate)
        gof = service_json(
            config, db, capsys, "test", *where, "gof", "--p0", P0[question_id], "--seed", str(SEED)
        )
        assert_same(results[question_id]["tests"]["gof"], gof)
    independence = service_json(
        config,
        db,
        capsys,
        "test",
        "--survey",
        "s1",
        "--question",
        "joint",
        "independence",
        "--seed",
        str(SEED),
    )
    assert_same(results["joint"]["tests"]["independence"], independence)
    assert results["rr"]["tests"]["gof"]["reject"]  # the control: rr's true p is far from p0


@pytest.mark.slow
def test_overlapping_exports_count_each_report_once(exported, tmp_path):
    _, _, surveys, messages, _ = exported
    extra = reports(surveys, 200, np.random.default_rng(SEED + 1))
    first, second = messages[: len(messages) // 2 + 500], messages[len(messages) // 2 :] + extra
    store_with(tmp_path / "a.sqlite", surveys, first)
    store_with(tmp_path / "b.sqlite", surveys, second)
    store_with(tmp_path / "union.sqlite", surveys, first + second)  # the store drops duplicates
    dirs = [
        str(export(tmp_path / "a.sqlite", surveys, tmp_path / "a", 3)),
        str(export(tmp_path / "b.sqlite", surveys, tmp_path / "b", 2)),
    ]
    assert inputs.resolve(dirs, surveys).may_overlap
    results = run_in_process(surveys, dirs, tmp_path / "r.json", dedup=True)
    for question_id, (n, sums) in store_statistics(tmp_path / "union.sqlite", surveys).items():
        assert (results[question_id]["n"], results[question_id]["sums"]) == (n, sums)
    assert sum(r["duplicates_dropped"] for r in results.values()) == 500
    assert all(r["conflicting_ids"] == 0 for r in results.values())
    naive = run_in_process(surveys, dirs, tmp_path / "naive.json", dedup=False)  # the control
    assert sum(r["n"] for r in naive.values()) == len(first) + len(second)


@pytest.mark.slow
def test_conflicting_copies_count_once_whatever_the_shard_order(exported, tmp_path):
    _, _, surveys, messages, _ = exported
    original = messages[0]  # an rr report
    altered = ldp_pb2.Report()
    altered.CopyFrom(original)
    altered.payload = ((int.from_bytes(original.payload, "little") + 1) % 4).to_bytes(4, "little")
    store_with(tmp_path / "a.sqlite", surveys, messages[:10])
    store_with(tmp_path / "b.sqlite", surveys, [altered])
    a = str(export(tmp_path / "a.sqlite", surveys, tmp_path / "a", 1))
    b = str(export(tmp_path / "b.sqlite", surveys, tmp_path / "b", 1))
    forward = run_in_process(surveys, [a, b], tmp_path / "f.json", dedup=True)["rr"]
    backward = run_in_process(surveys, [b, a], tmp_path / "b.json", dedup=True)["rr"]
    assert forward["n"] == 10 and forward["conflicting_ids"] == 1
    assert forward["duplicates_dropped"] == 1
    assert forward["sums"] == backward["sums"]


@pytest.mark.slow
def test_nothing_is_released_below_min_batch_size(tmp_path):
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML.replace("min_batch_size = 5", "min_batch_size = 50", 1))
    surveys = load_surveys(config)
    store_with(tmp_path / "s.sqlite", surveys, reports(surveys, 10, np.random.default_rng(1)))
    out = export(tmp_path / "s.sqlite", surveys, tmp_path / "out", 2)
    results = run_in_process(surveys, [str(out)], tmp_path / "r.json")
    for result in results.values():
        assert result["n"] == 10 and not result["released"]
        assert "50" in result["reason"]
        assert "estimate" not in result and "sums" not in result


def test_cli_user_errors_are_one_line(exported, tmp_path, capsys, monkeypatch):
    _, config, _, _, out = exported
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for file in out.iterdir():
        (corrupt / file.name).write_bytes(file.read_bytes())
    victim = sorted(corrupt.glob("*.ldpr"))[0]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))
    job = ["job", "--surveys", str(config), "--out", str(tmp_path / "r.json")]
    cases = [
        (["--shards", str(corrupt)], "checksum does not match"),
        (["--shards", str(tmp_path / "none-*.ldpr")], "no shard files match"),
        (["--shards", str(out), "--gof", "nope=0.5,0.5"], "matches no question"),
        (["--shards", str(out), "--gof", "rr=0.5,0.5"], "the question has 4 categories"),
        (
            ["--shards", str(out), "--direct-num-worker", "2"],
            "unknown Beam option(s): direct_num_worker",
        ),
    ]
    for extra, message in cases:
        capsys.readouterr()
        assert aggregator_main(job + extra) == 2
        stderr = capsys.readouterr().err
        assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    with pytest.raises(SystemExit) as exit_info:  # other commands take no Beam options
        aggregator_main(["rebuild", "--config", str(config), "--db", "x", "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_cli_without_beam_says_how_to_install_it(exported, tmp_path, capsys, monkeypatch):
    _, config, _, _, out = exported
    for name in [m for m in sys.modules if m.startswith("aggregator.jobs")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # as if the extra were not installed
    command = ["job", "--surveys", str(config), "--shards", str(out), "--out", str(tmp_path / "r")]
    assert aggregator_main(command) == 2
    assert "pip install 'ldp-survey[beam]'" in capsys.readouterr().err


def framed(records: list[bytes]) -> bytes:
    return shards.HEADER + b"".join(shards._varint(len(r)) + r for r in records)


def test_fast_framing_agrees_with_a_sequential_parse(exported):
    """Canonical records, records in another field order, records longer than 127 bytes, and ids
    that imitate a record header: every block size gives the protobuf ground truth."""
    _, _, surveys, messages, _ = exported
    rng = np.random.default_rng(3)
    canonical = [m.SerializeToString() for m in messages[:: len(messages) // 300]]
    imitator = ldp_pb2.Report()
    imitator.CopyFrom(messages[1])
    imitator.report_id = bytes([40, 0x0A, 0x10]) + rng.bytes(13)  # looks like a record start
    reordered = messages[2]
    swapped = (  # payload field first: valid protobuf, not the canonical layout
        b"\x22"
        + bytes([len(reordered.payload)])
        + reordered.payload
        + b"\x0a\x10"
        + reordered.report_id
        + b"\x12\x02s1\x1a"
        + bytes([len(reordered.question_id)])
        + reordered.question_id.encode()
    )
    long_message = messages[-1].SerializeToString() + b"\x2a\x80\x01" + bytes(128)  # unknown field
    records = [*canonical, imitator.SerializeToString(), swapped, long_message, *canonical[:5]]
    body = framed(records)
    truth = {}
    for record in records:
        report = ldp_pb2.Report.FromString(record)
        truth.setdefault(report.question_id, []).append(bytes(report.payload))
    for block_bytes in (7, 64, 1000, 1 << 20):
        seen: dict[str, list[bytes]] = {}
        for block in iter_blocks(io.BytesIO(body), "mem", block_bytes):
            for part in classify(block, surveys, "mem"):
                seen.setdefault(part.key[1], []).extend(bytes(row) for row in part.payloads)
        assert {q: sorted(v) for q, v in seen.items()} == {q: sorted(v) for q, v in truth.items()}
    fast, tail = split_records(framed(canonical)[len(shards.HEADER) :], "mem")
    starts, lengths, end = _split_sequential(framed(canonical)[len(shards.HEADER) :], "mem")
    assert (
        tail == b""
        and np.array_equal(fast.starts, starts)
        and np.array_equal(fast.lengths, lengths)
    )
    assert len(fast) == len(canonical) and end == len(framed(canonical)) - len(shards.HEADER)


def test_the_service_never_imports_beam():
    """Only `ldp-aggregator job` loads Beam; the server and the other commands stay light."""
    code = (
        "import sys, aggregator.service.server.app, aggregator.cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules\n"
        "              if m.startswith(('apache_beam', 'aggregator.jobs'))}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
