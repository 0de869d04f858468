"""Ed25519 device authentication for surveys with ``require_device_auth``: the signature format,
device keys and enrollment, and a real server on loopback that stores a signed upload only if the
signature, the enrolled key and the timestamp all check out (UNAUTHENTICATED otherwise), while the
report store never learns which device sent what."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sqlite3
import stat
import struct
import threading
import time
from pathlib import Path

import grpc
import pytest
from conftest import ServerThread
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aggregator.service.collector.device_auth import OFF_LOOP_REPORTS, DeviceAuthenticator
from aggregator.service.collector.registry import DeviceRegistry, DeviceRegistryError
from aggregator.survey_file.config import load_surveys
from client.device.keys import DeviceKey, DeviceKeyError, device_key_path
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.signature import DOMAIN, canonical_upload
from client.device.transport import Transport
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

QUESTION = """
[[survey.question]]
id = "{}"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""
# A signed survey counts one answer per device and question (docs/config.md, "Repeat answers"):
# the raw uploads below give each report of the secure survey a question of its own.
SECURE_QUESTIONS = 1000
SURVEYS_TOML = (
    """
[[survey]]
id = "secure"
require_device_auth = true
"""
    + QUESTION.format("q")
    + "".join(QUESTION.format(f"q{i}") for i in range(SECURE_QUESTIONS))
    + """
[[survey]]
id = "open"

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""
)
WINDOW = 300
BUDGET = Budget(5.0)


_NEXT_QUESTION = itertools.count()


def report(survey: str = "secure", value: int = 1) -> ldp_pb2.Report:
    """A report of question q of the open survey, or of the next question of the secure one."""
    secure = survey == "secure"
    return ldp_pb2.Report(
        report_id=os.urandom(16),
        survey_id=survey,
        question_id=f"q{next(_NEXT_QUESTION) % SECURE_QUESTIONS}" if secure else "q",
        payload=value.to_bytes(4, "little"),
    )


def copies(reports: list[ldp_pb2.Report]) -> list[ldp_pb2.Report]:
    return [ldp_pb2.Report.FromString(r.SerializeToString()) for r in reports]


def stored_ids(db: Path) -> set[bytes]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT report_id FROM reports")}


def enroll(registry_path: Path, *keys: DeviceKey) -> dict:
    with DeviceRegistry(registry_path, create=True) as registry:
        for key in keys:
            registry.enroll(key.public_key_pem())
        return registry.active_keys()


@pytest.fixture
def auth_surveys(tmp_path) -> Path:
    path = tmp_path / "auth-surveys.toml"
    path.write_text(SURVEYS_TOML)
    return path


@pytest.fixture
def state(tmp_path) -> Path:
    return tmp_path / "device.sqlite"


@pytest.fixture
def device(state) -> DeviceKey:
    return DeviceKey.load_or_create(device_key_path(state))


@pytest.fixture
def server(tmp_path, auth_surveys, device):
    keys = enroll(tmp_path / "devices.sqlite", device)
    running = ServerThread(auth_surveys, tmp_path / "reports.sqlite", device_keys=keys)
    yield running.start()
    running.stop()


@pytest.fixture
def collector(server):
    with grpc.insecure_channel(server.target) as channel:
        yield ldp_pb2_grpc.CollectorStub(channel)


def upload(collector, reports, metadata=None) -> list[int]:
    request = ldp_pb2.UploadRequest(reports=reports)
    return [r.status for r in collector.Upload(request, metadata=metadata, timeout=10).results]


def refused(call) -> str:
    with pytest.raises(grpc.RpcError) as error:
        call()
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, error.value.details()
    return error.value.details()


# --- format and keys ---------------------------------------------------------------------------


def test_rfc8032_test_vector_1():
    """The Ed25519 implementation the scheme relies on reproduces RFC 8032 section 7.1, TEST 1."""
    secret = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    public = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    signature = bytes.fromhex(
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )
    key = Ed25519PrivateKey.from_private_bytes(secret)
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    assert key.public_key().public_bytes(*raw) == public
    assert key.sign(b"") == signature
    key.public_key().verify(signature, b"")


def test_canonical_bytes_layout():
    r = ldp_pb2.Report(report_id=b"\x01" * 16, survey_id="s", question_id="qq", payload=b"\x07")
    expected = (
        b"ldp-survey/upload-signature/v1\x00"
        + struct.pack(">I", 5)
        + b"dev-1"
        + struct.pack(">Q", 1_700_000_000)
        + struct.pack(">I", 1)
        + b"s"
        + struct.pack(">I", 2)
        + b"qq"
        + struct.pack(">I", 16)
        + b"\x01" * 16
        + struct.pack(">I", 1)
        + b"\x07"
    )
    assert canonical_upload("dev-1", 1_700_000_000, [r]) == expected
    assert expected.startswith(DOMAIN)


def test_canonical_bytes_are_unambiguous():
    a = ldp_pb2.Report(report_id=b"\x00" * 16, survey_id="ab", question_id="c", payload=b"x")
    b = ldp_pb2.Report(report_id=b"\x00" * 16, survey_id="a", question_id="bc", payload=b"x")
    c = ldp_pb2.Report(report_id=b"\x02" * 16, survey_id="ab", question_id="c", payload=b"y")
    assert canonical_upload("d", 1, [a]) != canonical_upload("d", 1, [b])
    assert canonical_upload("d", 1, [a, c]) != canonical_upload("d", 1, [c, a])
    assert canonical_upload("d", 1, [a]) != canonical_upload("d", 2, [a])
    assert canonical_upload("d1", 1, [a]) != canonical_upload("d", 1, [a])


def test_device_key_file(tmp_path):
    path = device_key_path(tmp_path / "device.sqlite")
    assert path.name == "device.sqlite.device-key.pem"
    key = DeviceKey.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key.device_id.startswith("dev-") and len(key.device_id) == 28
    again = DeviceKey.load_or_create(path)
    assert again.device_id == key.device_id and again.public_key_pem() == key.public_key_pem()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    path.chmod(0o644)
    with pytest.raises(DeviceKeyError, match="chmod 600"):
        DeviceKey.load_or_create(path)
    ec_key = tmp_path / "ec.pem"
    ec_key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ec_key.chmod(0o600)
    with pytest.raises(DeviceKeyError, match="not an Ed25519 key"):
        DeviceKey.load_or_create(ec_key)


def test_registry(tmp_path):
    path = tmp_path / "devices.sqlite"
    with pytest.raises(DeviceRegistryError, match="not found"):
        DeviceRegistry(path)
    one = DeviceKey(Ed25519PrivateKey.generate())
    two = DeviceKey(Ed25519PrivateKey.generate())
    with DeviceRegistry(path, create=True) as registry:
        device, new = registry.enroll(one.public_key_pem(), one.device_id)
        assert new and device.device_id == one.device_id and device.active
        assert registry.enroll(one.public_key_pem()) == (device, False)
        with pytest.raises(DeviceRegistryError, match="does not belong"):
            registry.enroll(two.public_key_pem(), one.device_id)
        ec_public = ec.generate_private_key(ec.SECP256R1()).public_key()
        with pytest.raises(DeviceRegistryError, match="Ed25519"):
            registry.enroll(
                ec_public.public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
        with pytest.raises(DeviceRegistryError, match="not a PEM"):
            registry.enroll(b"garbage")
        registry.enroll(two.public_key_pem())
        assert set(registry.active_keys()) == {one.device_id, two.device_id}
        assert not registry.revoke(one.device_id).active
        assert set(registry.active_keys()) == {two.device_id}
        with pytest.raises(DeviceRegistryError, match="revoked"):
            registry.enroll(one.public_key_pem())
        with pytest.raises(DeviceRegistryError, match="unknown device"):
            registry.revoke("dev-000000000000000000000000")
    with DeviceRegistry(path) as registry:  # durable
        assert [d.device_id for d in registry.devices()] == [one.device_id, two.device_id]
        assert [d.active for d in registry.devices()] == [False, True]


class CallContext:
    """The two methods of ``grpc.aio.ServicerContext`` the authenticator uses (gRPC's object,
    not ours): the call's metadata, and abort."""

    def __init__(self, metadata=()) -> None:
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str):
        raise RuntimeError(f"{code.name}: {details}")


@pytest.mark.parametrize("size", [1, OFF_LOOP_REPORTS])  # verified on and off the event loop
def test_authenticate_upload_returns_the_verified_device_id(auth_surveys, size):
    """What the rate limiter keys on: the id verified for this call, None for an unsigned one."""
    key = DeviceKey(Ed25519PrivateKey.generate())
    auth = DeviceAuthenticator(load_surveys(auth_surveys), {key.device_id: _public(key)})
    reports = [report() for _ in range(size)]

    async def calls():
        return await asyncio.gather(
            auth.authenticate_upload(CallContext(key.sign_upload(reports)), reports),
            auth.authenticate_upload(CallContext(), [report("open")]),
        )

    assert asyncio.run(calls()) == [key.device_id, None]
    tampered = copies(reports)
    tampered[-1].payload = (3).to_bytes(4, "little")
    context = CallContext(key.sign_upload(reports))
    with pytest.raises(RuntimeError, match="UNAUTHENTICATED: the upload's device signature"):
        asyncio.run(auth.authenticate_upload(context, tampered))


def _public(key: DeviceKey):
    return serialization.load_pem_public_key(key.public_key_pem())


# --- end to end ----------------------------------------------------------------------------------


def test_reporter_signs_when_the_survey_requires_it(server, state):
    with Transport(server.target) as transport:
        reporter = Reporter(transport, state, BUDGET)
        try:
            first = reporter.answer("secure", "q", "b")
            reporter.answer("open", "q", "c")
            result = reporter.flush()
        finally:
            reporter.close()
    assert (result.accepted, result.duplicate, result.rejected, result.error) == (2, 0, 0, "")
    assert first in stored_ids(server.db)


def test_unenrolled_device_keeps_its_reports_until_enrolled(tmp_path, auth_surveys, state):
    """UNAUTHENTICATED says nothing about the reports: they stay pending (not dead-lettered) and
    go through, re-signed, once the device is enrolled."""
    db = tmp_path / "reports.sqlite"
    running = ServerThread(auth_surveys, db).start()
    try:
        with Transport(running.target) as transport:
            reporter = Reporter(transport, state, BUDGET)
            report_id = reporter.answer_index("secure", "q", 0)
            result = reporter.flush()
            assert "UNAUTHENTICATED" in result.error and "does not verify" in result.error
            assert (result.pending, result.rejected) == (1, 0)
            reporter.close()
    finally:
        running.stop()
    keys = enroll(tmp_path / "devices.sqlite", DeviceKey.load_or_create(device_key_path(state)))
    running = ServerThread(auth_surveys, db, device_keys=keys).start()
    try:
        with Transport(running.target) as transport:
            reporter = Reporter(transport, state)
            result = reporter.flush()
            reporter.close()
    finally:
        running.stop()
    assert (result.accepted, result.pending, result.error) == (1, 0, "")
    assert stored_ids(db) == {report_id}


def _tamper_payload(reports, metadata, device):
    reports[0].payload = (2).to_bytes(4, "little")  # valid, but not what was signed
    return reports, metadata


def _reorder(reports, metadata, device):
    return reports[::-1], metadata


def _wrong_key(reports, metadata, device):
    impostor = DeviceKey(Ed25519PrivateKey.generate())
    signature = dict(impostor.sign_upload(reports))["ldp-signature-bin"]
    return reports, _replace(metadata, "ldp-signature-bin", signature)


def _unknown_device(reports, metadata, device):
    return reports, DeviceKey(Ed25519PrivateKey.generate()).sign_upload(reports)


def _stale(reports, metadata, device):
    return reports, device.sign_upload(reports, timestamp=int(time.time()) - WINDOW - 5)


def _future(reports, metadata, device):
    return reports, device.sign_upload(reports, timestamp=int(time.time()) + WINDOW + 5)


def _missing(reports, metadata, device):
    return reports, None


def _no_signature(reports, metadata, device):
    return reports, tuple(m for m in metadata if m[0] != "ldp-signature-bin")


def _bad_timestamp(reports, metadata, device):
    return reports, _replace(metadata, "ldp-timestamp", "1.7e9")


def _short_signature(reports, metadata, device):
    return reports, _replace(metadata, "ldp-signature-bin", b"\x00" * 63)


def _replace(metadata, key, value):
    return tuple((k, value if k == key else v) for k, v in metadata)


@pytest.mark.parametrize(
    ("attack", "message"),
    [
        (_tamper_payload, "does not verify"),
        (_reorder, "does not verify"),
        (_wrong_key, "does not verify"),
        (_unknown_device, "does not verify"),
        (_stale, "from server time"),
        (_future, "from server time"),
        (_missing, "requires a signed upload"),
        (_no_signature, "missing authentication metadata"),
        (_bad_timestamp, "integer Unix seconds"),
        (_short_signature, "64 bytes"),
    ],
)
def test_refused_uploads_store_nothing(server, collector, device, attack, message):
    reports = [report(value=0), report(value=3)]
    sent, metadata = attack(copies(reports), device.sign_upload(reports), device)
    assert message in refused(lambda: upload(collector, sent, metadata))
    assert stored_ids(server.db) == set()
    # Control: the genuine signed upload of the same reports is accepted.
    assert upload(collector, reports, device.sign_upload(reports)) == [ldp_pb2.ACCEPTED] * 2


def test_timestamp_window_edges(server, collector, device):
    now = int(time.time())
    for offset in (-WINDOW + 10, WINDOW - 10):
        reports = [report()]
        assert upload(collector, reports, device.sign_upload(reports, now + offset)) == [
            ldp_pb2.ACCEPTED
        ]


def test_large_signed_upload(server, collector, device):
    """Uploads big enough to be verified off the event loop: tampering one report of 1,000 is
    refused, the genuine batch accepted."""
    reports = [report(value=i % 4) for i in range(1000)]
    metadata = device.sign_upload(reports)
    tampered = copies(reports)
    tampered[500].payload = ((reports[500].payload[0] + 1) % 4).to_bytes(4, "little")
    assert "does not verify" in refused(lambda: upload(collector, tampered, metadata))
    assert stored_ids(server.db) == set()
    assert upload(collector, reports, metadata) == [ldp_pb2.ACCEPTED] * 1000


def test_mixed_batch_is_all_or_nothing(server, collector):
    reports = [report("open"), report("secure")]
    refused(lambda: upload(collector, reports))
    assert stored_ids(server.db) == set()
    assert upload(collector, reports[:1]) == [ldp_pb2.ACCEPTED]  # open surveys need no signature


def test_a_signer_is_held_to_its_signature(server, collector, device):
    reports = [report("open")]
    metadata = _replace(device.sign_upload(reports), "ldp-signature-bin", b"\x01" * 64)
    assert "does not verify" in refused(lambda: upload(collector, reports, metadata))
    assert upload(collector, reports, device.sign_upload(reports)) == [ldp_pb2.ACCEPTED]


def test_retries_are_resigned_and_resends_are_duplicates(tmp_path, auth_surveys, device):
    """The server is down at first: every attempt carries a fresh signature over the same report
    bytes, the one that arrives is accepted, and a later resend is counted as a duplicate."""
    signed_at: list[float] = []

    def clock() -> float:
        signed_at.append(time.time())
        return signed_at[-1]

    signer = DeviceKey.load_or_create(device_key_path(tmp_path / "device.sqlite"), clock=clock)
    keys = enroll(tmp_path / "devices.sqlite", signer)
    running = ServerThread(auth_surveys, tmp_path / "late.sqlite", device_keys=keys)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reports = [report()]
    # attempts for about 40 s: the server starts 0.7 s in, later on a loaded machine
    transport = Transport(f"127.0.0.1:{port}", max_attempts=40, initial_backoff=0.2, max_backoff=1)
    timer = threading.Timer(0.7, running.start, kwargs={"port": port})
    timer.start()
    try:
        assert [r.status for r in transport.upload(reports, signer)] == [ldp_pb2.ACCEPTED]
        assert len(signed_at) >= 2  # at least one failed attempt, each signed anew
        assert [r.status for r in transport.upload(reports, signer)] == [ldp_pb2.DUPLICATE]
    finally:
        timer.join()
        transport.close()
        running.stop()
    assert stored_ids(running.db) == {reports[0].report_id}


def stream(collector, messages, metadata=None, signatures=None) -> list[int]:
    signatures = signatures or [b""] * len(messages)
    pairs = zip(messages, signatures, strict=True)
    requests = iter([ldp_pb2.UploadRequest(reports=m, signature=s) for m, s in pairs])
    response = collector.UploadStream(requests, metadata=metadata, timeout=10)
    return [r.status for r in response.results]


def test_signed_stream(server, collector, device):
    """Each message of a signed stream is verified as it arrives, by its own signature: a
    tampered message ends the call before anything of it is stored; a stream whose metadata
    signature covers reports (the unary form) is refused at once."""
    first, second = [report(), report("open")], [report(value=9), report()]  # 9: out of range
    metadata, signatures = device.sign_stream([first, second])
    tampered = copies(second)
    tampered[1].payload = (0).to_bytes(4, "little")
    assert "does not verify" in refused(
        lambda: stream(collector, [first, tampered], metadata, signatures)
    )
    assert stored_ids(server.db) <= {first[0].report_id, first[1].report_id}  # never the tampered
    statuses = stream(collector, [first, second], metadata, signatures)
    assert statuses[2:] == [ldp_pb2.REJECTED, ldp_pb2.ACCEPTED]
    assert stored_ids(server.db) == {first[0].report_id, first[1].report_id, second[1].report_id}
    unary_form = device.sign_upload(first)
    assert "does not verify" in refused(
        lambda: stream(collector, [first], unary_form, signatures[:1])
    )
    assert "64-byte signature" in refused(lambda: stream(collector, [first], metadata))


def test_unsigned_stream_rejects_reports_that_need_a_signature(server, collector):
    open_report, secure_report = report("open"), report("secure")
    requests = iter([ldp_pb2.UploadRequest(reports=[open_report, secure_report])])
    results = collector.UploadStream(requests, timeout=10).results
    assert [r.status for r in results] == [ldp_pb2.ACCEPTED, ldp_pb2.REJECTED]
    assert results[1].code == "UNAUTHENTICATED" and "requires a signed upload" in results[1].reason
    assert stored_ids(server.db) == {open_report.report_id}


def test_report_store_holds_no_device_identity(tmp_path, auth_surveys):
    """After authenticated uploads, no table, column or byte of the report store (database and
    WAL) contains a device id, public key or signature."""
    devices = [DeviceKey(Ed25519PrivateKey.generate()) for _ in range(3)]
    keys = enroll(tmp_path / "devices.sqlite", *devices)
    db = tmp_path / "reports.sqlite"
    running = ServerThread(auth_surveys, db, device_keys=keys).start()
    secrets: list[bytes] = []
    try:
        with Transport(running.target) as transport:
            for device in devices:
                reports = [report() for _ in range(20)]
                metadata = dict(device.sign_upload(reports))
                secrets += [device.device_id.encode(), metadata["ldp-signature-bin"]]
                public = _public(device).public_bytes(
                    serialization.Encoding.Raw, serialization.PublicFormat.Raw
                )
                secrets += [public, device.public_key_pem()]
                assert {r.status for r in transport.upload(reports, device)} == {ldp_pb2.ACCEPTED}
        raw = b"".join(p.read_bytes() for p in tmp_path.glob("reports.sqlite*"))
    finally:
        running.stop()
    raw += b"".join(p.read_bytes() for p in tmp_path.glob("reports.sqlite*"))
    with sqlite3.connect(db) as conn:
        tables = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        cells = [
            value
            for table in tables
            for row in conn.execute(f'SELECT * FROM "{table}"')
            for value in row
        ]
    assert len(stored_ids(db)) == 60
    for secret in secrets:
        assert secret not in raw
        assert not any(isinstance(c, bytes | str) and _contains(c, secret) for c in cells)
    assert not any("device" in t.lower() for t in tables)


def _contains(cell: bytes | str, secret: bytes) -> bool:
    return secret in (cell.encode() if isinstance(cell, str) else cell)


def test_revocation_takes_effect_without_a_restart(tmp_path, auth_surveys, device):
    """The server watches its registry file: a device revoked while it serves is refused within
    seconds, and a device enrolled meanwhile is accepted."""
    registry = tmp_path / "devices.sqlite"
    enroll(registry, device)
    running = ServerThread(auth_surveys, tmp_path / "reports.sqlite", devices=registry).start()
    newcomer = DeviceKey(Ed25519PrivateKey.generate())
    try:
        with grpc.insecure_channel(running.target) as channel:
            stub = ldp_pb2_grpc.CollectorStub(channel)
            first = [report()]
            assert upload(stub, first, device.sign_upload(first)) == [ldp_pb2.ACCEPTED]
            with DeviceRegistry(registry) as opened:
                opened.revoke(device.device_id)
                opened.enroll(newcomer.public_key_pem())
            deadline = time.monotonic() + 60  # finished, not how fast: a generous bound
            while True:
                batch = [report()]
                try:
                    upload(stub, batch, device.sign_upload(batch))
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
                    break
                assert time.monotonic() < deadline, "the revoked device is still accepted"
                time.sleep(0.1)
            batch = [report()]
            assert upload(stub, batch, newcomer.sign_upload(batch)) == [ldp_pb2.ACCEPTED]
    finally:
        running.stop()
