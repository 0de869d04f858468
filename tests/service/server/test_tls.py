"""Transport security over a real server on loopback: mTLS accepts a valid device and refuses a
missing certificate, a foreign CA, an expired certificate and the wrong key usage (gRPC's TLS
stack refuses them in the handshake, so the client sees UNAVAILABLE); TLS without client
certificates; and one-line errors for bad PEM files."""

from __future__ import annotations

import os

import grpc
import pytest
from conftest import ServerThread
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggregator.service.server.tls import server_credentials
from client.device.tls import TlsConfigError, TlsSettings
from client.device.transport import Transport, TransportError
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

REFUSED_DEVICES = ["foreign-device", "expired-device", "server-eku-device", "codesign-eku-device"]


def a_report(report_id: bytes | None = None) -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=report_id or os.urandom(16),
        survey_id="s1",
        question_id="rr",
        payload=(1).to_bytes(4, "little"),
    )


def channel_credentials(pki, device: str | None, ca: str = "ca") -> grpc.ChannelCredentials:
    """Raw gRPC credentials (no local checks), to show what the server itself refuses."""
    if device is None:
        return grpc.ssl_channel_credentials(pki.cert(ca).read_bytes())
    return grpc.ssl_channel_credentials(
        pki.cert(ca).read_bytes(), pki.key(device).read_bytes(), pki.cert(device).read_bytes()
    )


def upload(port: int, credentials: grpc.ChannelCredentials, report: ldp_pb2.Report):
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        return stub.Upload(ldp_pb2.UploadRequest(reports=[report]), timeout=10)


def health(port: int, credentials: grpc.ChannelCredentials) -> int:
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status


@pytest.fixture
def mtls_server(tmp_path, survey_file, pki):
    credentials = server_credentials(pki.cert("server"), pki.key("server"), pki.cert("ca"))
    running = ServerThread(survey_file, tmp_path / "reports.sqlite", credentials=credentials)
    yield running.start()
    running.stop()


@pytest.fixture
def tls_server(tmp_path, survey_file, pki):
    credentials = server_credentials(pki.cert("server"), pki.key("server"))
    running = ServerThread(survey_file, tmp_path / "reports.sqlite", credentials=credentials)
    yield running.start()
    running.stop()


def test_valid_device_is_accepted(mtls_server, pki):
    """The real client library over mTLS: survey fetch, upload, resend, health SERVING."""
    settings = TlsSettings(pki.cert("ca"), pki.cert("device"), pki.key("device"))
    with Transport(f"localhost:{mtls_server.port}", tls=settings) as transport:
        assert transport.get_survey("s1").id == "s1"
        report = a_report()
        assert [r.status for r in transport.upload([report])] == [ldp_pb2.ACCEPTED]
        assert [r.status for r in transport.upload([report])] == [ldp_pb2.DUPLICATE]
    assert (
        health(mtls_server.port, settings.credentials()) == health_pb2.HealthCheckResponse.SERVING
    )
    # The SAN IP address works as a target name too.
    with Transport(f"127.0.0.1:{mtls_server.port}", tls=settings) as transport:
        assert [r.status for r in transport.upload([a_report()])] == [ldp_pb2.ACCEPTED]


@pytest.mark.parametrize("device", [None, *REFUSED_DEVICES])
def test_refused_client_certificates(mtls_server, pki, device):
    """Each refused upload is UNAVAILABLE and stores nothing: the same report is new when the
    valid device sends it right after (which also shows the server is up and serving)."""
    report = a_report()
    with pytest.raises(grpc.RpcError) as refused:
        upload(mtls_server.port, channel_credentials(pki, device), report)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as probe:
        health(mtls_server.port, channel_credentials(pki, device))
    assert probe.value.code() == grpc.StatusCode.UNAVAILABLE
    response = upload(mtls_server.port, channel_credentials(pki, "device"), report)
    assert [r.status for r in response.results] == [ldp_pb2.ACCEPTED]


def test_refused_device_through_the_client_library(mtls_server, pki):
    settings = TlsSettings(pki.cert("ca"))  # no device certificate
    with (
        Transport(f"localhost:{mtls_server.port}", tls=settings, max_attempts=1) as transport,
        pytest.raises(TransportError) as refused,
    ):
        transport.upload([a_report()])
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE and refused.value.retryable


def test_plaintext_client_is_refused(mtls_server):
    with (
        grpc.insecure_channel(f"localhost:{mtls_server.port}") as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_server_only_tls(tls_server, pki):
    """Without --client-ca any client that trusts the CA connects; one trusting another CA
    refuses the server (the device authenticates the aggregator)."""
    settings = TlsSettings(pki.cert("ca"))
    with Transport(f"localhost:{tls_server.port}", tls=settings) as transport:
        assert [r.status for r in transport.upload([a_report()])] == [ldp_pb2.ACCEPTED]
    with pytest.raises(grpc.RpcError) as refused:
        health(tls_server.port, channel_credentials(pki, None, ca="foreign-ca"))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_credential_file_errors(pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    encrypted = tmp_path / "encrypted.key"
    key = serialization.load_pem_private_key(pki.key("server").read_bytes(), password=None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    cases = [
        ((tmp_path / "missing.pem", pki.key("server")), "cannot read server certificate"),
        ((garbage, pki.key("server")), "no valid PEM certificate"),
        ((pki.cert("server"), garbage), "no valid PEM private key"),
        ((pki.cert("server"), encrypted), "is encrypted"),
        ((pki.cert("server"), pki.key("device")), "does not match"),
        ((pki.cert("expired-device"), pki.key("expired-device")), "is valid only from"),
        ((pki.cert("server"), pki.key("server"), garbage), "client CA certificate"),
    ]
    for args, fragment in cases:
        with pytest.raises(TlsConfigError, match=fragment) as error:
            server_credentials(*args)
        assert "\n" not in str(error.value)


def test_client_settings_errors(pki, tmp_path):
    with pytest.raises(TlsConfigError, match="needs its key"):
        TlsSettings(pki.cert("ca"), cert=pki.cert("device"))
    with pytest.raises(TlsConfigError, match="cannot read CA certificate"):
        TlsSettings(tmp_path / "missing.pem").credentials()
    with pytest.raises(TlsConfigError, match="does not match"):
        TlsSettings(pki.cert("ca"), pki.cert("device"), pki.key("server")).credentials()
