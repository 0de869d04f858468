"""The PKI generator: the certificates have the extensions TLS relies on, chain to the CA under an
independent verifier (cryptography's X.509 path validation), and keys are private to the owner."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
import subprocess
import sys
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
