"""Offline devices over real gRPC: a device answers from its cached (or installed) survey
definition while the aggregator is unreachable, flushes later, and every report is counted
exactly once; a definition changed on the server meanwhile is refused, never miscounted."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from aggregator_process import free_port, spawn_serve
from cli_runner import run_cli, run_process
from conftest import ServerThread

from aggregator.store.sqlite.reader import StoreReader
from client.device.ledger import Budget
from client.device.repeats import AnsweredBefore
from client.device.reporter import Reporter
from client.device.transport import Transport, TransportError

BUDGET = Budget(5000.0)
LABELS = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"]  # question big/rr64, epsilon 50


def counts(db: Path, survey: str = "big", question: str = "rr64") -> list[int]:
    with StoreReader(db) as reader:
        n, sums = reader.statistics(survey, question, 8)
    assert n == int(sums.sum())
    return sums.tolist()


def quick(target: str) -> Transport:
    """A transport that gives up on an unreachable server at once."""
    return Transport(target, max_attempts=1, timeout=2)


def test_answers_offline_then_flushes_exactly(tmp_path, survey_file):
    """Forty devices fetch the definition while online, answer once each without signal, and
    are counted exactly once when the aggregator is back (a device answers a question once)."""
    db = tmp_path / "reports.sqlite"
    states = [tmp_path / f"device{i}.sqlite" for i in range(41)]
    port = free_port()
    server = ServerThread(survey_file, db).start(port)
    target = server.target
    with quick(target) as transport:
        for i, state in enumerate(states):
            device = Reporter(transport, state, BUDGET)
            if i == 0:
                device.answer("big", "rr64", "c3")  # online: fetches and caches the definition
                assert device.flush().accepted == 1 and not device.offline
            else:
                device.survey("big")  # fetched and cached; no answer yet
            device.close()
    server.stop()

    rng = np.random.default_rng(7)
    answers = rng.integers(0, 8, size=40)
    spent = 0.0
    with quick(target) as transport:
        for state, answer in zip(states[1:], answers, strict=True):
            device = Reporter(transport, state)
            device.answer("big", "rr64", LABELS[int(answer)])
            assert device.offline  # answered from the cache
            result = device.flush()
            assert result.pending == 1 and "UNAVAILABLE" in result.error
            spent += device.ledger.spent()[0]
            device.close()
    assert spent == pytest.approx(40 * 50.0)  # every offline answer was charged

    server = ServerThread(survey_file, db).start(port)
    try:
        accepted = 0
        with quick(target) as transport:
            for state in states[1:]:
                device = Reporter(transport, state)
                result = device.flush()
                device.close()
                assert (result.pending, result.rejected) == (0, 0)
                accepted += result.accepted
        assert accepted == 40
        expected = np.bincount(answers, minlength=8)
        expected[3] += 1
        assert counts(db) == expected.tolist()  # epsilon 50: each report is its answer
    finally:
        server.stop()


def test_definition_changed_while_offline_is_refused_not_miscounted(tmp_path, survey_file):
    """Five devices answer offline under a definition changed on the server meanwhile: each
    report is refused for good, never miscounted, and, never counted, it does not stop the
    device from answering again under the new definition."""
    db = tmp_path / "reports.sqlite"
    states = [tmp_path / f"device{i}.sqlite" for i in range(5)]
    port = free_port()
    server = ServerThread(survey_file, db).start(port)
    with quick(server.target) as transport:
        for state in states:
            device = Reporter(transport, state, BUDGET)
            device.survey("big")  # fetched and cached; no report yet
            device.close()
    server.stop()

    stale = []
    with quick(server.target) as transport:
        for state in states:
            device = Reporter(transport, state)
            stale.append(device.answer("big", "rr64", "c1"))
            assert device.offline
            device.close()

    # meanwhile the question's categories were reordered on the server (no data pinned it yet)
    edited = tmp_path / "edited.toml"
    edited.write_text(survey_file.read_text().replace('"c0", "c1", "c2"', '"c1", "c0", "c2"'))
    server = ServerThread(edited, db).start(port)
    try:
        with quick(server.target) as transport:
            dead = []
            for state in states:
                device = Reporter(transport, state)
                result = device.flush()
                assert (result.accepted, result.rejected, result.pending) == (0, 1, 0)
                [refusal] = result.refusals
                assert refusal.startswith("FAILED_PRECONDITION: question 'rr64' was")
                dead += device.outbox.rejected()
                device.close()
            assert {item.report_id for item, _, _ in dead} == set(stale)
            assert {code for _, code, _ in dead} == {"FAILED_PRECONDITION"}
            assert counts(db) == [0] * 8  # nothing was counted under the new order
            device = Reporter(transport, states[0])
            device.answer("big", "rr64", "c1")  # online again: the new definition is fetched
            assert device.flush().accepted == 1
            with pytest.raises(AnsweredBefore):  # counted now: one answer
                device.answer("big", "rr64", "c2")
            device.close()
        assert counts(db) == [1, 0, 0, 0, 0, 0, 0, 0]  # "c1" is index 0 in the new order
    finally:
        server.stop()


def cli(tool: str, *args: str) -> subprocess.CompletedProcess:
    return run_cli(tool, *args)  # in this process (tests/cli_runner.py)


def test_installed_survey_answers_without_ever_being_online(tmp_path, survey_file):
    """The newcomer's field tablet: install the exported definition, answer without signal
    (queued, exit 0), flush once the aggregator is up."""
    db, state = tmp_path / "reports.sqlite", tmp_path / "device.sqlite"
    definition = tmp_path / "big.survey.json"
    done = cli("agg", "export-survey", "--config", str(survey_file), "--survey", "big")
    assert done.returncode == 0, done.stderr
    definition.write_text(done.stdout)
    assert json.loads(done.stdout)["format"] == "ldp-survey-definition/1"

    port = free_port()
    common = ["--server", f"127.0.0.1:{port}", "--insecure", "--state", str(state)]
    answer = ["--survey", "big", "--question", "rr64", "--timeout", "1"]
    # A real process: no line of gRPC's C core about the refused connection on stderr either.
    nothing = run_process(
        "client", "submit", *common, *answer, "--answer", "c2", "--budget", "1000"
    )

    assert nothing.returncode == 2 and "install-survey" in nothing.stderr
    assert len(nothing.stderr.strip().splitlines()) == 1 and "Traceback" not in nothing.stderr

    tablets = [state, tmp_path / "tablet2.sqlite", tmp_path / "tablet3.sqlite"]
    for tablet, label in zip(tablets, ("c2", "c2", "c5"), strict=True):
        done = cli("client", "install-survey", str(definition), "--state", str(tablet))
        assert done.returncode == 0 and "installed survey big" in done.stdout, done.stderr
        listed = json.loads(cli("client", "surveys", "--state", str(tablet), "--json").stdout)
        assert [row["survey"] for row in listed] == ["big"]
        assert listed[0]["source"] == str(definition)
        own = [*common[:-1], str(tablet)]
        budget = [] if tablet == state else ["--budget", "1000"]
        done = cli("client", "submit", *own, *answer, "--answer", label, *budget)
        assert done.returncode == 0, done.stderr
        assert "queued" in done.stdout and "unreachable" in done.stdout

    process, served = spawn_serve(
        tmp_path / "port", "--config", str(survey_file), "--db", str(db), "--insecure"
    )
    try:
        flush = ["flush", "--server", f"127.0.0.1:{served}", "--insecure", "--state"]
        for tablet in tablets:
            done = cli("client", *flush, str(tablet))
            assert done.returncode == 0 and "accepted 1" in done.stdout, done.stdout + done.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    assert counts(db) == [0, 0, 2, 0, 0, 1, 0, 0]


def test_install_survey_refuses_a_file_that_is_not_one(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    done = cli("client", "install-survey", str(bad), "--state", str(tmp_path / "d.sqlite"))
    assert done.returncode == 2 and "not a survey definition file" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_survey_is_not_answered_from_nothing(tmp_path, server):
    with quick(server.target) as transport:
        device = Reporter(transport, tmp_path / "d.sqlite", BUDGET)
        with pytest.raises(TransportError, match="unknown survey"):
            device.answer("nope", "q", "a")
        device.close()
