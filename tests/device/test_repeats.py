"""One respondent, one answer: the repeat policy of a question in the survey file, the device
refusing or memoizing a second answer across restarts (real SQLite state), the one-line CLI
error, and the aggregator holding a signed survey to one stored report per device and question
over a real gRPC server on loopback, with nothing at rest linking a report to a device."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path

import grpc
import pytest
from aggregator_process import spawn_serve
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.service.collector.limits import KeyPseudonyms
from aggregator.service.collector.registry import DeviceRegistry
from aggregator.survey_file.config import ConfigError, load_limits, load_surveys
from client.device.keys import DeviceKey, device_key_path
from client.device.ledger import Budget
from client.device.repeats import AnsweredBefore
from client.device.reporter import Reporter
from client.device.transport import Transport
from client.survey import MEMOIZE, REFUSE, SurveyError, SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

QUESTIONS = """
[[survey.question]]
id = "insured"
categories = ["no", "yes"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "mood"
categories = ["good", "fair", "poor"]
mechanism = "randomized_response"
epsilon = 1.0
"""
SIGNED_TOML = '[[survey]]\nid = "clinic"\nrequire_device_auth = true\n' + QUESTIONS


def load_surveys_text(questions: str) -> SurveySpec:
    """The survey "s" of a survey file with these questions (written to a temporary file)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return load_surveys(write(Path(folder), '[[survey]]\nid = "s"\n' + questions))["s"]


def write(tmp_path: Path, text: str, name: str = "surveys.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the survey file -----------------------------------------------------------------------------


def test_a_survey_file_without_the_field_refuses_repeats(tmp_path):
    [survey] = load_surveys(write(tmp_path, '[[survey]]\nid = "s"\n' + QUESTIONS)).values()
    assert {q.repeat for q in survey.questions} == {REFUSE}


def test_survey_default_and_question_override(tmp_path):
    text = '[[survey]]\nid = "s"\nrepeat = "memoize"\n' + QUESTIONS.replace(
        'id = "mood"', 'id = "mood"\nrepeat = "refuse"'
    )
    survey = load_surveys(write(tmp_path, text))["s"]
    assert (survey.question("insured").repeat, survey.question("mood").repeat) == (MEMOIZE, REFUSE)


def test_the_policy_is_not_part_of_the_definition_digest(tmp_path):
    """It changes no report, only whether a device sends a second one: switching it keeps the
    pinned definition valid."""
    plain = load_surveys(write(tmp_path, '[[survey]]\nid = "s"\n' + QUESTIONS, "a.toml"))["s"]
    memo = '[[survey]]\nid = "s"\nrepeat = "memoize"\n' + QUESTIONS
    memoized = load_surveys(write(tmp_path, memo, "b.toml"))["s"]
    assert [q.digest for q in plain.questions] == [q.digest for q in memoized.questions]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            'repeat = "replace"',
            "repeat = 'replace' is not supported: the aggregator could un-count",
        ),
        ('repeat = "count"', "repeat must be one of refuse, memoize, got 'count'"),
        ("repeat = true", "repeat must be one of refuse, memoize, got True"),
    ],
)
def test_bad_policies_are_refused_in_one_line(tmp_path, setting, message):
    path = write(
        tmp_path, '[[survey]]\nid = "s"\n' + QUESTIONS.replace("epsilon = 1.0", setting, 1)
    )
    path.write_text(path.read_text().replace(setting, f"epsilon = 1.0\n{setting}", 1))
    with pytest.raises(ConfigError, match="question insured: ") as error:
        load_surveys(path)
    assert message in str(error.value) and "\n" not in str(error.value)
    done = run_cli("agg", "check-config", path)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_signed_surveys_get_a_one_answer_cap(tmp_path):
    limits = load_limits(write(tmp_path, SIGNED_TOML))["clinic"]
    assert limits.one_answer and limits.cap("insured") == limits.cap("mood") == 1
    unsigned = '[[survey]]\nid = "open"\n' + QUESTIONS
    assert load_limits(write(tmp_path, unsigned, "open.toml")) == {}


def test_a_cap_above_one_contradicts_a_signed_survey(tmp_path):
    text = SIGNED_TOML.replace(
        "require_device_auth = true", "require_device_auth = true\nmax_reports_per_device = 3"
    )
    with pytest.raises(ConfigError, match="contradicts one answer per device"):
        load_limits(write(tmp_path, text))


# --- the device ----------------------------------------------------------------------------------


@pytest.fixture
def open_server(tmp_path):
    running = ServerThread(write(tmp_path, '[[survey]]\nid = "s"\n' + QUESTIONS), tmp_path / "r.db")
    yield running.start()
    running.stop()


def test_device_refuses_a_second_answer_across_a_restart(open_server, tmp_path):
    state = tmp_path / "tablet.sqlite"
    with Transport(open_server.target) as transport:
        device = Reporter(transport, state, Budget(5.0))
        device.answer("s", "insured", "yes")
        device.close()
        device = Reporter(transport, state)  # a restart: everything comes from the file
        try:
            for answer in ("yes", "no"):  # unchanged or changed: refused alike
                with pytest.raises(AnsweredBefore, match="answered s/insured already"):
                    device.answer("s", "insured", answer)
            assert len(device.ledger.charges()) == 1 and len(device.outbox) == 1
            device.answer("s", "mood", "fair")  # another question is another answer
            result = device.flush()
        finally:
            device.close()
    assert (result.accepted, result.rejected) == (2, 0)
    with sqlite3.connect(open_server.db) as conn:
        assert conn.execute("SELECT count(*) FROM reports").fetchone() == (2,)


def test_memoizing_device_resends_its_first_report_across_a_restart(open_server, tmp_path):
    state = tmp_path / "tablet.sqlite"
    with Transport(open_server.target) as transport:
        device = Reporter(transport, state, Budget(5.0), memoize=True)
        first = device.answer("s", "insured", "yes")
        assert device.flush().accepted == 1
        device.close()
        device = Reporter(transport, state, memoize=True)
        try:
            assert device.answer("s", "insured", "no") == first  # the first answer stands
            assert len(device.ledger.charges()) == 1
            result = device.flush()
        finally:
            device.close()
    assert (result.accepted, result.duplicate) == (0, 1)  # counted once


def test_a_memoize_policy_reaches_the_device_over_the_wire(tmp_path):
    """The survey file says memoize; the device learns it from GetSurvey (Question.repeat) and
    resends its first report without being told so by its app."""
    config = write(tmp_path, '[[survey]]\nid = "s"\nrepeat = "memoize"\n' + QUESTIONS)
    survey = load_surveys(config)["s"]
    wire = ldp_pb2.Survey.FromString(survey.to_proto().SerializeToString())
    assert [q.repeat for q in wire.questions] == [ldp_pb2.REPEAT_MEMOIZE] * 2
    running = ServerThread(config, tmp_path / "r.db").start()
    try:
        with Transport(running.target) as transport:
            device = Reporter(transport, tmp_path / "tablet.sqlite", Budget(5.0))
            try:
                first = device.answer("s", "insured", "yes")
                assert device.answer("s", "insured", "no") == first
                result = device.flush()
            finally:
                device.close()
        assert (result.accepted, result.duplicate) == (1, 0)  # one report, sent once
    finally:
        running.stop()


def test_an_unknown_repeat_policy_is_refused_by_the_device():
    message = load_surveys_text(QUESTIONS).to_proto()
    message.questions[0].repeat = 7  # a policy from a newer aggregator
    with pytest.raises(SurveyError, match="repeat policy this device does not know"):
        SurveySpec.from_proto(message)


def test_the_device_keeps_the_report_not_the_answer(open_server, tmp_path):
    """The first-answer table holds the randomized report, byte for byte what the server
    receives (the outbox's copy), and nothing else about the answer."""
    state = tmp_path / "tablet.sqlite"
    with Transport(open_server.target) as transport:
        device = Reporter(transport, state, Budget(5.0))
        report_id = device.answer("s", "mood", "poor")
        [queued] = device.outbox.pending()
        device.close()
    with sqlite3.connect(state) as conn:
        rows = conn.execute("SELECT * FROM answered").fetchall()
    assert rows == [("s", "mood", report_id, queued.payload, queued.definition_digest)]


def test_cli_second_submit_is_one_line_and_exit_2(open_server, tmp_path):
    state = tmp_path / "tablet.sqlite"
    command = ["submit", "--server", open_server.target, "--insecure", "--state", state]
    command += ["--survey", "s", "--question", "insured", "--answer", "yes"]
    assert run_cli("client", *command, "--budget", "5").returncode == 0
    done = run_cli("client", *command)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("ldp-client: error: this device has answered s/insured already")
    assert "repeat policy is 'refuse'" in line
    memoized = run_cli("client", *command, "--memoize")
    assert memoized.returncode == 0 and "duplicate 1" in memoized.stdout


# --- the aggregator, signed uploads ------------------------------------------------------------


def report(question: str, value: int = 1) -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=os.urandom(16),
        survey_id="clinic",
        question_id=question,
        payload=value.to_bytes(4, "little"),
    )


class Clinic:
    """A signed survey on loopback with one enrolled tablet."""

    def __init__(self, tmp_path: Path) -> None:
        self.config = write(tmp_path, SIGNED_TOML)
        self.db = tmp_path / "reports.sqlite"
        self.state = tmp_path / "tablet.sqlite"
        self.key = DeviceKey.load_or_create(device_key_path(self.state))
        with DeviceRegistry(tmp_path / "devices.sqlite", create=True) as registry:
            registry.enroll(self.key.public_key_pem())
            self.keys = registry.active_keys()
        self.running: ServerThread | None = None

    def start(self) -> ServerThread:
        self.running = ServerThread(self.config, self.db, device_keys=self.keys).start()
        return self.running

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None

    def upload(self, reports: list[ldp_pb2.Report]) -> list[str]:
        assert self.running is not None
        with grpc.insecure_channel(self.running.target) as channel:
            stub = ldp_pb2_grpc.CollectorStub(channel)
            request = ldp_pb2.UploadRequest(reports=reports)
            metadata = self.key.sign_upload(reports)
            response = stub.Upload(request, metadata=metadata, timeout=10)
        return [ldp_pb2.ReportStatus.Name(r.status) for r in response.results]

    def refused(self, reports: list[ldp_pb2.Report]) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as error:
            self.upload(reports)
        return error.value


@pytest.fixture
def clinic(tmp_path):
    clinic = Clinic(tmp_path)
    clinic.start()
    yield clinic
    clinic.stop()


def stored(db: Path) -> list[tuple[bytes, str]]:
    with sqlite3.connect(db) as conn:
        return sorted(conn.execute("SELECT report_id, question_id FROM reports"))


def test_second_report_of_a_device_is_refused_and_a_resend_is_a_duplicate(clinic):
    first = report("insured")
    assert clinic.upload([first]) == ["ACCEPTED"]
    error = clinic.refused([report("insured", 0)])
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "answered before" in error.details() and "clinic/insured" in error.details()
    assert clinic.upload([first]) == ["DUPLICATE"]  # the lost ack: resend, counted once
    assert clinic.upload([report("mood")]) == ["ACCEPTED"]  # another question
    both = clinic.refused([report("mood"), report("mood")])  # two answers in one upload
    assert both.code() == grpc.StatusCode.FAILED_PRECONDITION
    clinic.stop()
    clinic.start()  # the count survives a restart (the cap file, written on a graceful stop)
    assert clinic.refused([report("insured")]).code() == grpc.StatusCode.FAILED_PRECONDITION
    assert clinic.upload([first]) == ["DUPLICATE"]
    assert sorted(question for _, question in stored(clinic.db)) == ["insured", "mood"]


def test_signed_stream_rejects_the_second_answer_with_its_reason(clinic):
    assert clinic.running is not None
    first, second = report("insured"), report("insured", 0)
    messages = [[first], [second]]
    metadata, signatures = clinic.key.sign_stream(messages)  # each message signed on its own
    requests = [
        ldp_pb2.UploadRequest(reports=m, signature=s)
        for m, s in zip(messages, signatures, strict=True)
    ]
    with grpc.insecure_channel(clinic.running.target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        response = stub.UploadStream(iter(requests), metadata=metadata, timeout=10)
    statuses = [(ldp_pb2.ReportStatus.Name(r.status), r.code) for r in response.results]
    assert statuses == [("ACCEPTED", ""), ("REJECTED", "FAILED_PRECONDITION")]
    assert "answered before" in response.results[1].reason


def test_a_device_that_lost_its_state_has_its_second_answer_dead_lettered(clinic, tmp_path):
    """A reinstalled tablet (same enrolled key, fresh state file) answers again: the device cannot
    know, the aggregator refuses it for good and the device keeps it as a dead letter."""
    assert clinic.running is not None
    reinstalled = tmp_path / "reinstalled.sqlite"
    shutil.copy(device_key_path(clinic.state), device_key_path(reinstalled))
    with Transport(clinic.running.target) as transport:
        outcomes = []
        for state in (clinic.state, reinstalled):
            device = Reporter(transport, state, Budget(5.0))
            try:
                device.answer("clinic", "insured", "yes")
                result = device.flush()
                outcomes.append((result.accepted, result.rejected, result.pending, result.error))
                rejected = device.outbox.rejected()
            finally:
                device.close()
    assert outcomes == [(1, 0, 0, ""), (0, 1, 0, "")]
    [(_, code, reason)] = rejected
    assert code == "FAILED_PRECONDITION" and "answered before" in reason


def test_nothing_at_rest_links_a_report_to_a_device(clinic):
    """The report store (database and WAL) holds no device pseudonym; the counts file holds the
    pseudonym and per-question counts but no report id."""
    reports = [report("insured"), report("mood")]
    assert clinic.upload(reports) == ["ACCEPTED", "ACCEPTED"]
    clinic.refused([report("insured")])
    clinic.stop()  # the counts are written on a graceful stop
    pseudonym = KeyPseudonyms.beside(str(clinic.db))(f"device:{clinic.key.device_id}")
    store = b"".join(
        p.read_bytes()
        for p in clinic.db.parent.glob("reports.sqlite*")
        if not p.name.endswith((".caps", ".limits-secret"))
    )
    assert pseudonym.encode() not in store and clinic.key.device_id.encode() not in store
    caps = Path(f"{clinic.db}.caps")
    with sqlite3.connect(caps) as conn:
        rows = sorted(conn.execute("SELECT * FROM cap_counts"))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert rows == [(pseudonym, "clinic", "insured", 1), (pseudonym, "clinic", "mood", 1)]
    counts = caps.read_bytes()
    assert not any(r.report_id in counts for r in reports)


# --- the command line -------------------------------------------------------------------------


def test_check_config_shows_the_policy(tmp_path):
    text = '[[survey]]\nid = "s"\n' + QUESTIONS.replace(
        'id = "mood"', 'id = "mood"\nrepeat = "memoize"'
    )
    path = write(tmp_path, text)
    done = run_cli("agg", "check-config", path)
    assert done.returncode == 0
    assert "mood: randomized_response, epsilon = 1, k = 3, repeat = memoize" in done.stdout
    assert "insured: randomized_response, epsilon = 1, k = 2\n" in done.stdout
    rows = json.loads(run_cli("agg", "check-config", path, "--json").stdout)["surveys"]
    assert [q["repeat"] for q in rows[0]["questions"]] == [REFUSE, MEMOIZE]


def test_workers_serve_a_signed_survey_and_say_the_aggregator_does_not_check(tmp_path):
    """Several worker processes cannot share the counts: the server says so and serves (the
    devices still answer once); a declared cap is still refused with --workers."""
    clinic = Clinic(tmp_path)
    registry = tmp_path / "devices.sqlite"
    args = ["--config", str(clinic.config), "--db", str(clinic.db), "--devices", str(registry)]
    process, _ = spawn_serve(tmp_path / "port", *args, "--insecure", "--workers", "2")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "the aggregator does not check one answer per device" in stderr
    capped = write(
        tmp_path,
        SIGNED_TOML.replace("epsilon = 1.0", "epsilon = 1.0\nmax_reports_per_device = 1", 1),
        "capped.toml",
    )
    args[1] = str(capped)
    done = run_cli("agg", "serve", *args, "--insecure", "--workers", "2", "--port", "0")
    assert done.returncode == 2 and "serve them with --workers 1" in done.stderr


def test_a_second_simulation_with_the_same_keys_is_refused_in_one_line(tmp_path):
    """Simulated devices are devices: each key answers each question once."""
    keys = tmp_path / "sim-keys"
    assert run_cli("client", "simulate-keys", "--out", keys, "--devices", "3").returncode == 0
    registry = tmp_path / "devices.sqlite"
    enrolled = run_cli("agg", "enroll", "--devices", registry, "--public-key", keys)
    assert enrolled.returncode == 0, enrolled.stderr
    with DeviceRegistry(registry, read_only=True) as devices:
        active = devices.active_keys()
    running = ServerThread(write(tmp_path, SIGNED_TOML), tmp_path / "r.db", device_keys=active)
    running.start()
    try:
        command = ["simulate", "--server", running.target, "--insecure", "--survey", "clinic"]
        command += ["--devices", "3", "--keys", keys, "--json"]
        first = run_cli("client", *command)
        assert first.returncode == 0 and json.loads(first.stdout)["accepted"] == 6
        again = run_cli("client", *command)
    finally:
        running.stop()
    assert again.returncode == 2 and "answered before" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert stored(running.db) and len(stored(running.db)) == 6
