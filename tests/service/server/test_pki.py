"""The PKI generator: the certificates have the extensions TLS relies on, chain to the CA under an
independent verifier (cryptography's X.509 path validation), and keys are private to the owner."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from aggregator.service.server import pki

ROOT = Path(__file__).resolve().parents[3]


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def extension(cert: x509.Certificate, oid: x509.ObjectIdentifier):
    return cert.extensions.get_extension_for_oid(oid)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "pki"
    script = str(ROOT / "scripts" / "gen_pki.py")
    done = subprocess.run(
        [sys.executable, script, "--out", str(out), "--devices", "2", "--days", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_script_writes_every_file_with_private_keys(generated):
    names = {p.name for p in generated.iterdir()}
    stems = ["ca", "server", "device-0001", "device-0002", "analyst-ca", "analyst-0001"]
    assert names == {f"{s}.{ext}" for s in stems for ext in ("pem", "key")}
    for path in generated.iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path.suffix == ".key" else 0o644), path


def test_ca_extensions(generated):
    ca = load(generated / "ca.pem")
    constraints = extension(ca, ExtensionOID.BASIC_CONSTRAINTS)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = extension(ca, ExtensionOID.KEY_USAGE).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    ski = extension(ca, ExtensionOID.SUBJECT_KEY_IDENTIFIER).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(ca.public_key())
    assert ca.issuer == ca.subject
    validity = ca.not_valid_after_utc - ca.not_valid_before_utc
    assert validity == dt.timedelta(days=2)


def test_server_and_device_extensions(generated):
    ca = load(generated / "ca.pem")
    ca_ski = extension(ca, ExtensionOID.SUBJECT_KEY_IDENTIFIER).value.digest
    server = load(generated / "server.pem")
    assert extension(server, ExtensionOID.EXTENDED_KEY_USAGE).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    san = extension(server, ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    for device_id in ("device-0001", "device-0002"):
        device = load(generated / f"{device_id}.pem")
        eku = extension(device, ExtensionOID.EXTENDED_KEY_USAGE).value
        assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        san = extension(device, ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
        assert san.get_values_for_type(x509.DNSName) == [device_id]
        aki = extension(device, ExtensionOID.AUTHORITY_KEY_IDENTIFIER).value
        assert aki.key_identifier == ca_ski
        assert not extension(device, ExtensionOID.BASIC_CONSTRAINTS).value.ca


def test_chains_verify_with_an_independent_verifier(generated):
    ca = load(generated / "ca.pem")
    policy = PolicyBuilder().store(Store([ca]))
    server = load(generated / "server.pem")
    policy.build_server_verifier(x509.DNSName("localhost")).verify(server, [])
    policy.build_server_verifier(x509.IPAddress(ipaddress.ip_address("127.0.0.1"))).verify(
        server, []
    )
    verified = policy.build_client_verifier().verify(load(generated / "device-0001.pem"), [])
    assert verified.subjects == [x509.DNSName("device-0001")]
    with pytest.raises(VerificationError):  # a server certificate is no client certificate
        policy.build_client_verifier().verify(server, [])
    with pytest.raises(VerificationError):
        policy.build_server_verifier(x509.DNSName("example.org")).verify(server, [])


def test_negative_fixtures_fail_the_independent_verifier(pki):
    """The refused certificates of the TLS tests are refused for the intended reason."""
    ca = load(pki.cert("ca"))
    verifier = PolicyBuilder().store(Store([ca])).build_client_verifier()
    verifier.verify(load(pki.cert("device")), [])
    for name in ("foreign-device", "expired-device", "server-eku-device", "codesign-eku-device"):
        with pytest.raises(VerificationError):
            verifier.verify(load(pki.cert(name)), [])


def test_never_overwrites(tmp_path):
    pki.write_pki(tmp_path, devices=0, days=1)
    before = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(FileExistsError):
        pki.write_pki(tmp_path, devices=1, days=1)
    assert (tmp_path / "ca.key").read_bytes() == before
    assert not (tmp_path / "device-0001.pem").exists()


def test_script_user_errors(generated, tmp_path):
    script = [sys.executable, str(ROOT / "scripts" / "gen_pki.py")]
    again = subprocess.run([*script, "--out", str(generated)], capture_output=True, text=True)
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    bad = subprocess.run(
        [*script, "--out", str(tmp_path / "x"), "--days", "0"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def _handshake(cert: Path, key: Path, ca: Path, address: str) -> None:
    """A real TLS handshake: a server on ``address`` with ``cert``, a client trusting ``ca``
    that checks the name it dialled (as a device does)."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(ca))
    with socket.create_server((address, 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            connection, _ = listener.accept()
            try:
                with server_context.wrap_socket(connection, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with (
                socket.create_connection((address, port), timeout=30) as raw,
                client_context.wrap_socket(raw, server_hostname=address) as tls,
            ):
                tls.sendall(b"x")
        finally:
            thread.join(timeout=30)


def test_host_names_and_addresses_devices_dial(tmp_path):
    """--host puts the names and addresses devices reach the server by into its certificate
    (issue 40 item 3: only localhost and 127.0.0.1 before, so a device dialling the server's
    address failed hostname verification)."""
    script = [sys.executable, str(ROOT / "scripts" / "gen_pki.py")]
    out = tmp_path / "pki"
    hosts = ["--host", "127.0.0.2", "--host", "Ingest-1.Example.org", "--host", "::1"]
    done = subprocess.run([*script, "--out", str(out), *hosts], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    server = load(out / "server.pem")
    san = extension(server, ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "ingest-1.example.org"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1",
        "127.0.0.2",
        "::1",
    ]
    policy = PolicyBuilder().store(Store([load(out / "ca.pem")]))
    policy.build_server_verifier(x509.DNSName("ingest-1.example.org")).verify(server, [])
    _handshake(out / "server.pem", out / "server.key", out / "ca.pem", "127.0.0.2")
    bad = subprocess.run(
        [*script, "--out", str(tmp_path / "bad"), "--host", "no_underscores.example"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--host" in bad.stderr
    assert not (tmp_path / "bad" / "ca.key").exists()


def test_a_renewed_server_certificate_is_trusted_by_the_devices_as_they_are(tmp_path):
    """--renew-server-from signs a new server certificate with the existing CA: a device that
    trusts the old ca.pem completes the handshake with it, on the new address too."""
    script = [sys.executable, str(ROOT / "scripts" / "gen_pki.py")]
    old = tmp_path / "pki"
    pki.write_pki(old, devices=1, days=2)
    with pytest.raises(ssl.SSLCertVerificationError):  # the old one does not name 127.0.0.2
        _handshake(old / "server.pem", old / "server.key", old / "ca.pem", "127.0.0.2")
    new = tmp_path / "next"
    renew = [*script, "--renew-server-from", str(old), "--out", str(new), "--host", "127.0.0.2"]
    done = subprocess.run(renew, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in new.iterdir()) == ["server.key", "server.pem"]
    assert stat.S_IMODE((new / "server.key").stat().st_mode) == 0o600
    assert (new / "server.pem").read_bytes() != (old / "server.pem").read_bytes()
    _handshake(new / "server.pem", new / "server.key", old / "ca.pem", "127.0.0.2")
    again = subprocess.run(renew, capture_output=True, text=True)
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
    missing = subprocess.run(
        [*script, "--renew-server-from", str(tmp_path / "none"), "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
