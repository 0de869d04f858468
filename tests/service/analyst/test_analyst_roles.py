"""Roles over real gRPC and real TLS: the Analyst is never served on the device listener, its own
listener refuses device certificates (PERMISSION_DENIED) and missing or unknown tokens
(UNAUTHENTICATED), accepts analyst certificates and tokens, records every state-changing call in
the audit log with the analyst's identity, and refuses the call (UNAVAILABLE, nothing changed)
when the log cannot be written; ``serve`` refuses settings that would expose the Analyst, in one
process and with ``--workers 2`` (docs/threat-model.md "Roles", docs/operations.md)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import grpc
import pytest
from aggregator_process import analyst_port, spawn_serve
from cli_runner import run_cli, run_process
from confirm.test_confirm_flow import CONFIG, CONFIRMATION, MOOD, PLAN, fill, reports
from conftest import ServerThread

from aggregator.service.analyst.auth import CALLER, AnalystAccess
from aggregator.service.analyst.execution import caller_of
from aggregator.service.private_files import privacy_problem
from aggregator.service.server import pki
from aggregator.service.server.tls import server_credentials
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

ANALYST_METHODS = [m.name for m in ldp_pb2.DESCRIPTOR.services_by_name["Analyst"].methods]
STATE_CHANGING = ("Preregister", "Confirm", "HoldoutTest")
HOLDOUT = ldp_pb2.HoldoutRequest(
    survey_id="split", question_id="mood", test="goodness_of_fit", p0=[0.25] * 4
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A device CA (server, device-0001), an analyst CA (analyst-0001) and a foreign CA's
    analyst certificate, written as gen_pki writes them."""
    root = tmp_path_factory.mktemp("roles-pki")
    pki.write_pki(root, devices=1, days=1, analysts=1)
    foreign = pki.new_ca("foreign analyst CA", days=1)
    pki.issue_analyst(foreign, "mallory", days=1).write(root / "mallory.pem", root / "mallory.key")
    return root


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(CONFIG.format(fraction=0.5))
    return path


def filled(tmp_path: Path, config: Path) -> Path:
    """A store with 600 confirmation-side reports of split/mood (enough for a holdout query)."""
    surveys = load_surveys(config)
    db = tmp_path / "reports.sqlite"
    fill(db, surveys, reports(surveys["split"].question("mood"), MOOD, 600, CONFIRMATION, 9))
    return db


def channel_to(target: str, certs: Path, client: str | None = None) -> grpc.Channel:
    """A TLS channel trusting the server's CA, with ``client``'s certificate if given."""
    pair = {}
    if client is not None:
        pair = {
            "private_key": (certs / f"{client}.key").read_bytes(),
            "certificate_chain": (certs / f"{client}.pem").read_bytes(),
        }
    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes(), **pair)
    return grpc.secure_channel(target.replace("127.0.0.1", "localhost"), credentials)


def raw_call(channel: grpc.Channel, method: str, metadata=()) -> grpc.StatusCode:
    """The status of ``/ldp.v1.Analyst/<method>`` with an empty request (OK if answered)."""
    call = channel.unary_unary(
        f"/ldp.v1.Analyst/{method}", request_serializer=bytes, response_deserializer=bytes
    )
    try:
        call(b"", timeout=20, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def audit_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def mtls_server(config: Path, db: Path, certs: Path, **access) -> ServerThread:
    """Device mTLS (device CA) and the analyst listener with ``access`` (TLS, same server
    certificate, device CA known so that device certificates are recognised)."""
    files = {
        "tls_cert": certs / "server.pem",
        "tls_key": certs / "server.key",
        "device_ca": certs / "ca.pem",
        **access,
    }
    credentials = server_credentials(certs / "server.pem", certs / "server.key", certs / "ca.pem")
    return ServerThread(
        config, db, credentials=credentials, analyst_access=AnalystAccess(**files)
    ).start()


def test_the_device_listener_never_serves_the_analyst(tmp_path, config, certs):
    """Every Analyst RPC on the device listener is UNIMPLEMENTED: anonymous on a plaintext
    server, and with a valid device certificate under mTLS."""
    plain = ServerThread(config, tmp_path / "plain.sqlite").start()
    try:
        with grpc.insecure_channel(plain.target) as channel:
            assert {raw_call(channel, m) for m in ANALYST_METHODS} == {
                grpc.StatusCode.UNIMPLEMENTED
            }
    finally:
        plain.stop()
    server = mtls_server(config, tmp_path / "tls.sqlite", certs)
    try:
        with channel_to(server.target, certs, "device-0001") as channel:
            codes = {m: raw_call(channel, m) for m in ANALYST_METHODS}
        assert set(codes.values()) == {grpc.StatusCode.UNIMPLEMENTED}, codes
    finally:
        server.stop()


def test_a_device_certificate_is_refused_and_an_analyst_certificate_works(tmp_path, config, certs):
    db = filled(tmp_path, config)
    server = mtls_server(config, db, certs, client_ca=certs / "analyst-ca.pem")
    audit = Path(f"{db}.audit.jsonl")
    try:
        with channel_to(server.analyst_target, certs, "device-0001") as channel:
            codes = {m: raw_call(channel, m) for m in ANALYST_METHODS}
            stub = ldp_pb2_grpc.AnalystStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.HoldoutTest(HOLDOUT, timeout=20)
        assert set(codes.values()) == {grpc.StatusCode.PERMISSION_DENIED}, codes
        assert "not an analyst's" in refused.value.details()
        assert audit.read_text() == ""  # refused at the gate: nothing attempted
        for who in (None, "mallory"):  # no certificate, another CA's: the handshake fails
            with channel_to(server.analyst_target, certs, who) as channel:
                assert raw_call(channel, "Estimate") == grpc.StatusCode.UNAVAILABLE
        with channel_to(server.analyst_target, certs, "analyst-0001") as channel:
            answer = ldp_pb2_grpc.AnalystStub(channel).HoldoutTest(HOLDOUT, timeout=60)
        assert answer.query == 1
        attempt, done = audit_lines(audit)
        assert attempt["analyst"] == done["analyst"] == "analyst-0001"
        assert (attempt["event"], done["event"], done["query"]) == ("attempt", "done", 1)
        assert done["level"] == pytest.approx(answer.level)
    finally:
        server.stop()


def test_tokens_over_tls(tmp_path, config, certs):
    """Absent, malformed and unknown tokens are UNAUTHENTICATED; a good one works and names
    the caller; a revoked one stops working without a restart."""
    tokens = tmp_path / "analysts.tokens"
    alice = run_cli("agg", "analyst-token", "add", "alice", "--tokens", tokens, check=True)
    token = alice.stdout.strip()
    assert token not in tokens.read_text()
    assert hashlib.sha256(token.encode()).hexdigest() in tokens.read_text()
    db = filled(tmp_path, config)
    server = mtls_server(config, db, certs, tokens=tokens)
    try:
        with channel_to(server.analyst_target, certs) as channel:
            for metadata in (
                (),
                (("authorization", token),),  # no scheme
                (("authorization", "Bearer " + token[:-1] + "x"),),
                (("authorization", "Basic " + token),),
            ):
                codes = {raw_call(channel, m, metadata) for m in ANALYST_METHODS}
                assert codes == {grpc.StatusCode.UNAUTHENTICATED}, metadata
            stub = ldp_pb2_grpc.AnalystStub(channel)
            good = (("authorization", f"Bearer {token}"),)
            prereg = ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN)
            registered = stub.Preregister(prereg, metadata=good, timeout=30)
            assert registered.plan_sha256 == hashlib.sha256(PLAN.encode()).hexdigest()
            run_cli("agg", "analyst-token", "revoke", "alice", "--tokens", tokens, check=True)
            assert raw_call(channel, "Estimate", good) == grpc.StatusCode.UNAUTHENTICATED
        lines = audit_lines(Path(f"{db}.audit.jsonl"))
        assert [(x["analyst"], x["rpc"], x["event"]) for x in lines] == [
            ("alice", "Preregister", "attempt"),
            ("alice", "Preregister", "done"),
        ]
        assert lines[1]["plan_sha256"] == registered.plan_sha256
    finally:
        server.stop()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o666, 0o620])
def test_serve_refuses_a_token_file_others_may_read_or_write(tmp_path, config, mode):
    """A token file others may write lets them add a token of their own (issue 37: with 0666
    another local user appended a hash and was an analyst 1.5 s later); one others may read
    tells them who the analysts are. ``serve`` refuses both in one line."""
    tokens = tmp_path / "t.tokens"
    run_cli("agg", "analyst-token", "add", "alice", "--tokens", tokens, check=True)
    tokens.chmod(mode)
    db = tmp_path / "x.sqlite"
    done = run_process(  # a process: a server that starts anyway fails the test at the timeout
        "agg", "serve", "--config", config, "--db", db, "--port", "0", "--insecure",
        "--analyst-tokens", tokens, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"has mode {mode:04o}" in lines[0] and "chmod 600" in lines[0]


def test_a_token_file_opened_up_while_serving_lets_nobody_in(tmp_path, config, certs):
    """chmod 0666 on a running server's token file: from the next call every token is refused
    (UNAUTHENTICATED, saying why), a hash appended by someone else among them; mended (0600), the
    file's tokens work again."""
    tokens = tmp_path / "analysts.tokens"
    token = run_cli("agg", "analyst-token", "add", "alice", "--tokens", tokens).stdout.strip()
    intruder = "ldpa_" + "x" * 43
    db = filled(tmp_path, config)
    server = mtls_server(config, db, certs, tokens=tokens)
    request = ldp_pb2.EstimateRequest(survey_id="split", question_id="mood")
    try:
        with channel_to(server.analyst_target, certs) as channel:
            stub = ldp_pb2_grpc.AnalystStub(channel)
            good = (("authorization", f"Bearer {token}"),)
            bad = (("authorization", f"Bearer {intruder}"),)
            assert raw_call(channel, "Estimate", good) != grpc.StatusCode.UNAUTHENTICATED
            tokens.chmod(0o666)
            with tokens.open("a") as out:  # what another local user could now do
                out.write(f"mallory {hashlib.sha256(intruder.encode()).hexdigest()}\n")
            for metadata in (good, bad):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Estimate(request, metadata=metadata, timeout=30)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "has mode 0666" in refused.value.details()
            tokens.chmod(0o600)
            assert raw_call(channel, "Estimate", good) != grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop()


def test_a_secret_file_of_another_user_is_refused(tmp_path):
    """Owned by another user, a private file is still not the server's own (the check needs no
    root: it reads the owner from the file's status)."""
    path = tmp_path / "t.tokens"
    path.write_text("")
    path.chmod(0o600)
    info = path.stat()
    assert privacy_problem(path, info, "the analyst token file") is None
    fields = list(info)
    fields[stat.ST_UID] = info.st_uid + 1
    problem = privacy_problem(path, os.stat_result(fields), "the analyst token file")
    assert problem is not None and f"belongs to uid {info.st_uid + 1}" in problem


def test_the_audit_log_records_every_state_change_and_refusal(tmp_path, config):
    """Loopback without credentials: the identity is "loopback"; every line has the time, the
    analyst, the RPC, the survey and the outcome; the file is 0600 and only appended to."""
    db = filled(tmp_path, config)
    audit = tmp_path / "audit" / "analysts.jsonl"
    audit.parent.mkdir()
    server = ServerThread(config, db, audit_log=audit).start()
    try:
        stub = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        answer = stub.HoldoutTest(HOLDOUT, timeout=60)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Confirm(ldp_pb2.ConfirmRequest(survey_id="nope"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as mode:
            stub.Preregister(ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN), timeout=30)
        assert mode.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # holdout mode
        with pytest.raises(grpc.RpcError) as unreleased:  # a read: never audited
            stub.Estimate(ldp_pb2.EstimateRequest(survey_id="split", question_id="mood"))
        assert unreleased.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        server.stop()
    assert stat.S_IMODE(audit.stat().st_mode) == 0o600
    lines = audit_lines(audit)
    assert [(x["rpc"], x["event"], x.get("code")) for x in lines] == [
        ("HoldoutTest", "attempt", None),
        ("HoldoutTest", "done", None),
        ("Confirm", "attempt", None),
        ("Confirm", "refused", "NOT_FOUND"),
        ("Preregister", "attempt", None),
        ("Preregister", "refused", "FAILED_PRECONDITION"),
    ]
    assert {x["analyst"] for x in lines} == {"loopback"}
    assert [x["survey"] for x in lines] == ["split"] * 2 + ["nope"] * 2 + ["split"] * 2
    assert lines[0]["question"] == "mood" and lines[0]["test"] == "goodness_of_fit"
    assert lines[1]["query"] == answer.query == 1
    assert lines[1]["level"] == pytest.approx(answer.level)
    assert all(x["time"].endswith("+00:00") for x in lines)


def test_an_unwritable_audit_log_refuses_the_call_and_changes_nothing(tmp_path, config):
    db = filled(tmp_path, config)
    audit = Path(f"{db}.audit.jsonl")
    server = ServerThread(config, db).start()
    try:
        stub = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        audit.unlink()
        audit.mkdir()  # the log cannot be opened for appending any more
        prereg = ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN)
        for call, request in ((stub.Preregister, prereg), (stub.HoldoutTest, HOLDOUT)):
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "audit log" in refused.value.details()
        audit.rmdir()
        registered = stub.Preregister(prereg, timeout=30)
        assert not registered.already  # nothing was registered while the log was down
    finally:
        server.stop()
    assert [x["event"] for x in audit_lines(audit)] == ["attempt", "done"]


def test_the_caller_of_an_analysis_is_the_analyst():
    """The analysis limits count per analyst (the gate's identity), not per peer address."""
    token = CALLER.set("alice")
    try:
        assert caller_of(None) == "alice"
    finally:
        CALLER.reset(token)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (("--insecure", "--analyst-host", "0.0.0.0"), "is not loopback"),
        (("--insecure", "--analyst-host", "192.0.2.1"), "is not loopback"),
        (("--insecure", "--analyst-host", "0.0.0.0", "--analyst-tokens", "{tokens}"), "plaintext"),
        (("--insecure", "--analyst-client-ca", "{certs}/analyst-ca.pem"), "needs TLS"),
        (
            ("{tls}", "--client-ca", "{certs}/ca.pem", "--analyst-client-ca", "{certs}/ca.pem"),
            "differ",
        ),
        (("--insecure", "--analyst-tokens", "{missing}"), "analyst-token add"),
        (("--insecure", "--audit-log", "{tmp}"), "cannot write the audit log"),
        (("--insecure", "--port", "50071", "--analyst-port", "50071"), "must differ"),
    ],
)
def test_serve_refuses_settings_that_expose_the_analyst(tmp_path, config, certs, flags, fragment):
    tokens = tmp_path / "t.tokens"
    run_cli("agg", "analyst-token", "add", "alice", "--tokens", tokens, check=True)
    tls = f"--tls-cert={certs}/server.pem --tls-key={certs}/server.key"
    values = {
        "certs": certs,
        "ca": certs / "ca.pem",
        "tokens": tokens,
        "missing": tmp_path / "none",
        "tmp": tmp_path,
    }
    args = []
    for flag in flags:
        args += tls.split() if flag == "{tls}" else [flag.format(**values)]
    db = tmp_path / "x.sqlite"
    done = run_cli("agg", "serve", "--config", config, "--db", db, "--port", "0", *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in done.stderr, lines


def test_analyst_token_commands(tmp_path):
    tokens = tmp_path / "sub" / "t.tokens"
    tokens.parent.mkdir()
    first = run_cli("agg", "analyst-token", "add", "alice", "--tokens", tokens, check=True)
    second = run_cli("agg", "analyst-token", "add", "bob", "--tokens", tokens, check=True)
    assert first.stdout != second.stdout and first.stdout.startswith("ldpa_")
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    listing = run_cli("agg", "analyst-token", "list", "--tokens", tokens, "--json", check=True)
    assert json.loads(listing.stdout) == ["alice", "bob"]
    for args, fragment in (
        (("add", "alice"), "exists"),
        (("add", "no spaces"), "token name"),
        (("revoke", "carol"), "no analyst token named"),
    ):
        done = run_cli("agg", "analyst-token", *args, "--tokens", tokens)
        assert done.returncode == 2 and fragment in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    run_cli("agg", "analyst-token", "revoke", "alice", "--tokens", tokens, check=True)
    listing = run_cli("agg", "analyst-token", "list", "--tokens", tokens, check=True)
    assert listing.stdout.split() == ["bob"]
    tokens.write_text("alice not-a-hash\n")
    done = run_cli("agg", "analyst-token", "list", "--tokens", tokens)
    assert done.returncode == 2 and "expected 'NAME SHA256-HEX'" in done.stderr


@pytest.mark.slow
def test_roles_with_workers(tmp_path, config, certs):
    """serve --workers 2 with TLS, device mTLS, an analyst CA and tokens: the device port
    serves no Analyst RPC, the analyst port wants both an analyst certificate and a token,
    and records the caller in the audit log."""
    tokens = tmp_path / "t.tokens"
    token = run_cli("agg", "analyst-token", "add", "alice", "--tokens", tokens).stdout.strip()
    db = filled(tmp_path, config)
    port_file = tmp_path / "port"
    process, port = spawn_serve(
        port_file,
        *("--config", str(config), "--db", str(db), "--workers", "2"),
        *("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")),
        *("--client-ca", str(certs / "ca.pem")),
        *("--analyst-client-ca", str(certs / "analyst-ca.pem"), "--analyst-tokens", str(tokens)),
        timeout=90,
    )
    analyst = f"127.0.0.1:{analyst_port(port_file)}"
    good = (("authorization", f"Bearer {token}"),)
    try:
        with channel_to(f"127.0.0.1:{port}", certs, "device-0001") as channel:
            for _ in range(4):  # connections land on either worker
                codes = {raw_call(channel, m, good) for m in ANALYST_METHODS}
                assert codes == {grpc.StatusCode.UNIMPLEMENTED}
        with channel_to(analyst, certs, "device-0001") as channel:
            assert raw_call(channel, "Confirm", good) == grpc.StatusCode.PERMISSION_DENIED
        with channel_to(analyst, certs, "analyst-0001") as channel:
            assert raw_call(channel, "Confirm") == grpc.StatusCode.UNAUTHENTICATED
            answer = ldp_pb2_grpc.AnalystStub(channel).HoldoutTest(
                HOLDOUT, metadata=good, timeout=60
            )
        assert answer.query == 1
    finally:
        process.terminate()
        process.communicate(timeout=60)
    assert process.returncode == 0
    lines = audit_lines(Path(f"{db}.audit.jsonl"))
    assert [(x["analyst"], x["event"]) for x in lines] == [("alice", "attempt"), ("alice", "done")]
