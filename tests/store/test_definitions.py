"""Definitions pinned to data: the store keeps each question's definition from its first report
on, every command refuses a survey file that changes it, and a report randomized under another
definition is refused on the wire (FAILED_PRECONDITION), never counted."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
import subprocess
from pathlib import Path

import grpc
import pytest
from cli_runner import run_cli, run_process
from conftest import ServerThread

from aggregator.store.definitions import DefinitionChangedError
from aggregator.store.sqlite import pins
from aggregator.store.sqlite.reader import StoreReader
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from client.device.transport import Transport, TransportError
from client.survey import Attribute, build_question
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return run_cli(tool, *args)  # in this process (tests/cli_runner.py)


def one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def reference_digest(question_id, mechanism, parameter, bits, attributes) -> bytes:
    """docs/config.md's encoding, written out independently of client/survey.py."""
    fields = ["ldp-question-definition/1", question_id, mechanism]
    fields += [struct.pack(">d", parameter).hex(), "" if bits is None else str(bits)]
    fields.append(str(len(attributes)))
    for name, categories in attributes:
        fields += [name, str(len(categories)), *categories]
    data = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
    return hashlib.sha256(data).digest()


def test_digest_follows_the_documented_encoding():
    rr = build_question("q", "", [Attribute("q", ("1", "2", "3"))], "randomized_response", 1.5)
    assert rr.digest == reference_digest("q", "randomized_response", 1.5, None, [("q", "123")])
    gauss = build_question("g", "t", [Attribute("g", ("a", "b"))], "gaussian", 0.25, 8)
    assert gauss.digest == reference_digest("g", "gaussian", 0.25, 8, [("g", "ab")])
    # every field of the definition moves the digest; the question text does not
    variants = [
        build_question("q", "", [Attribute("q", ("1", "2", "3"))], "randomized_response", 3.0),
        build_question("q", "", [Attribute("q", ("1", "2", "3"))], "flip_components", 1.5),
        build_question("q", "", [Attribute("q", ("1", "3", "2"))], "randomized_response", 1.5),
        build_question("q", "", [Attribute("x", ("1", "2", "3"))], "randomized_response", 1.5),
    ]
    assert len({rr.digest, *(v.digest for v in variants)}) == 5
    same = build_question(
        "q", "new wording", [Attribute("q", ("1", "2", "3"))], "randomized_response", 1.5
    )
    assert same.digest == rr.digest
    laplace = build_question("l", "", [Attribute("l", ("a", "b"))], "laplace", 1.0, 8)
    assert (
        laplace.digest
        != build_question("l", "", [Attribute("l", ("a", "b"))], "laplace", 1.0, 9).digest
    )


def changed(survey_file: Path, tmp_path: Path, old: str, new: str) -> Path:
    text = survey_file.read_text()
    assert old in text
    path = tmp_path / "changed.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def store_with_reports(survey_file: Path, db: Path, count: int = 6) -> None:
    running = ServerThread(survey_file, db).start()
    try:
        with Transport(running.target) as transport:
            survey = transport.get_survey("s1")
            question = survey.question("rr")
            reports = [
                ldp_pb2.Report(
                    report_id=os.urandom(16),
                    survey_id="s1",
                    question_id="rr",
                    payload=question.mechanism.encode(question.mechanism.randomize(i % 4)),
                    definition_digest=question.digest,
                )
                for i in range(count)
            ]
            transport.upload(reports)
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (
            'epsilon = 1.0\n\n[[survey.question]]\nid = "fc"',
            'epsilon = 3.0\n\n[[survey.question]]\nid = "fc"',
            "epsilon",
        ),
        (
            'mechanism = "randomized_response"\nepsilon = 1.0',
            'mechanism = "laplace"\nepsilon = 1.0',
            "mechanism",
        ),
        ('categories = ["a", "b", "c", "d"]', 'categories = ["a", "b", "d", "c"]', "categories"),
    ],
)
def test_store_refuses_a_changed_question_with_reports(tmp_path, survey_file, old, new, field):
    db = tmp_path / "reports.sqlite"
    store_with_reports(survey_file, db)
    surveys = load_surveys(changed(survey_file, tmp_path, old, new))
    with ReportStore(db) as store, pytest.raises(DefinitionChangedError) as caught:
        pins.register(store, surveys)
    assert f"question rr: {field}" in str(caught.value)
    with StoreReader(db) as reader, pytest.raises(DefinitionChangedError, match=field):
        reader.check_definitions(surveys)
    with ReportStore(db) as store:  # the original file is still fine
        pins.register(store, load_surveys(survey_file))


def test_a_question_without_reports_follows_the_file(tmp_path, survey_file):
    db = tmp_path / "reports.sqlite"
    with ReportStore(db) as store:
        pins.register(store, load_surveys(survey_file))
    edited = changed(
        survey_file, tmp_path, 'categories = ["a", "b", "c", "d"]', 'categories = ["a", "b"]'
    )
    with ReportStore(db) as store:  # no data yet: the pin (and k) follow the new definition
        pins.register(store, load_surveys(edited))
        assert store.statistics("s1", "rr")[1].size == 2
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT definition FROM question_definitions WHERE question_id = 'rr'"
        ).fetchone()
    assert json.loads(row[0])["attributes"][0]["categories"] == ["a", "b"]


def test_legacy_store_is_pinned_on_first_write(tmp_path, survey_file):
    db = tmp_path / "reports.sqlite"
    store_with_reports(survey_file, db)
    with sqlite3.connect(db) as conn:  # a store written before pins existed
        conn.execute("DROP TABLE question_definitions")
    with StoreReader(db) as reader:
        reader.check_definitions(load_surveys(survey_file))  # nothing pinned: only k is known
    edited = changed(
        survey_file, tmp_path, 'categories = ["a", "b", "c", "d"]', 'categories = ["a", "b"]'
    )
    with StoreReader(db) as reader, pytest.raises(DefinitionChangedError, match="4"):
        reader.check_definitions(load_surveys(edited))
    with ReportStore(db) as store:
        pins.register(store, load_surveys(survey_file))
    eps = changed(survey_file, tmp_path, "epsilon = 1.0", "epsilon = 2.0")
    with StoreReader(db) as reader, pytest.raises(DefinitionChangedError, match="epsilon"):
        reader.check_definitions(load_surveys(eps))


def test_every_command_refuses_a_changed_file_in_one_line(tmp_path, survey_file):
    db = tmp_path / "reports.sqlite"
    store_with_reports(survey_file, db)
    edited = str(changed(survey_file, tmp_path, "epsilon = 1.0", "epsilon = 3.0"))
    common = ["--config", edited, "--db", str(db)]
    question = ["--survey", "s1", "--question", "rr"]
    commands = [
        ["estimate", *common, *question],
        ["test", *common, *question, "gof", "--p0", "0.25,0.25,0.25,0.25"],
        ["rebuild", *common],
        ["export", *common, "--survey", "s1", "--out", str(tmp_path / "shards")],
        ["check-config", edited, "--db", str(db)],
        ["serve", *common, "--insecure", "--port", "0"],
    ]
    for command in commands:
        line = one_line_error(run("agg", *command), "survey s1, question rr", "epsilon")
        assert "3.0" in line and "1.0" in line, line
    # and the unchanged file still works
    good = ["--config", str(survey_file), "--db", str(db)]
    assert run("agg", "estimate", *good, *question).returncode == 0


@pytest.mark.slow
def test_job_refuses_shards_of_another_definition(tmp_path, survey_file):
    db = tmp_path / "reports.sqlite"
    store_with_reports(survey_file, db)
    out = tmp_path / "shards"
    done = run(
        "agg",
        "export",
        "--config",
        str(survey_file),
        "--db",
        str(db),
        "--survey",
        "s1",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    edited = str(changed(survey_file, tmp_path, "epsilon = 1.0", "epsilon = 3.0"))
    results = str(tmp_path / "results.json")
    # A process of its own: the Beam job (apache_beam and its logging) stays out of pytest's.
    done = run_process("agg", "job", "--config", edited, "--shards", str(out), "--out", results)

    one_line_error(done, "survey s1, question rr: epsilon is 3.0", "epsilon = 1.0")
    done = run(
        "agg",
        "import",
        "--config",
        edited,
        "--db",
        str(tmp_path / "new.sqlite"),
        "--from",
        str(out),
    )
    one_line_error(done, "survey s1, question rr: epsilon is 3.0", "epsilon = 1.0")


def test_stale_digest_is_refused_on_the_wire_and_never_counted(tmp_path, survey_file, server):
    question = server.surveys["s1"].question("rr")
    stale = reference_digest("rr", "randomized_response", 3.0, None, [("rr", "abcd")])
    payload = question.mechanism.encode(0)

    def report(digest: bytes) -> ldp_pb2.Report:
        return ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id="s1",
            question_id="rr",
            payload=payload,
            definition_digest=digest,
        )

    with Transport(server.target, max_attempts=1) as transport:
        with pytest.raises(TransportError) as caught:
            transport.upload([report(question.digest), report(stale)])
        assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "definition" in caught.value.details
        with grpc.insecure_channel(server.target) as channel:
            stub = ldp_pb2_grpc.CollectorStub(channel)
            streamed = stub.UploadStream(iter([ldp_pb2.UploadRequest(reports=[report(stale)])]))
        assert streamed.results[0].code == "FAILED_PRECONDITION"
        assert stored_count(server.db) == 0
        # the current digest and an empty one (a device before 0.2) are both accepted
        results = transport.upload([report(question.digest), report(b"")])
        assert [r.status for r in results] == [ldp_pb2.ACCEPTED] * 2
    assert stored_count(server.db) == 2


def stored_count(db: Path) -> int:
    with StoreReader(db) as reader:
        return reader.statistics("s1", "rr", 4)[0]


def test_export_refuses_a_non_empty_folder_unless_forced(tmp_path, survey_file):
    db = tmp_path / "reports.sqlite"
    store_with_reports(survey_file, db)
    out = tmp_path / "shards"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    export = ["export", "--config", str(survey_file), "--db", str(db), "--survey", "s1"]
    one_line_error(run("agg", *export, "--out", str(out)), "not empty", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    done = run("agg", *export, "--out", str(out), "--force")
    assert done.returncode == 0 and "exported 6 reports" in done.stdout, done.stderr
    assert (out / "notes.txt").read_text() == "mine"


def test_json_errors_are_json(tmp_path, survey_file):
    missing = str(tmp_path / "missing.sqlite")
    agg = run(
        "agg",
        "estimate",
        "--config",
        str(survey_file),
        "--db",
        missing,
        "--survey",
        "s1",
        "--question",
        "rr",
        "--json",
    )
    assert json.loads(one_line_error(agg))["error"].startswith("report store not found")
    client = run("client", "budget", "--state", missing, "--json")
    assert json.loads(one_line_error(client))["status"] == 2
