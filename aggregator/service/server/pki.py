"""Certificates for TLS and mTLS between devices, analysts and the aggregator, built with
``cryptography``.

One EC P-256 certificate authority signs a server certificate (EKU serverAuth, SAN ``localhost``
and ``127.0.0.1``) and one certificate per device (EKU clientAuth, SAN DNS ``<device id>``). A
second CA, for analysts only, signs analyst client certificates (EKU clientAuth, CN the
analyst's name): the analyst listener trusts it and refuses the device CA's certificates. The
functions are importable so tests build a fresh PKI in temporary directories at run time (no key
is ever committed); ``scripts/gen_pki.py`` writes one to disk for manual and operational use.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLOCK_SKEW = dt.timedelta(minutes=5)  # certificates start this long before "now"
SERVER_HOSTS = ("localhost",)
SERVER_IPS = ("127.0.0.1",)
ANALYST_CA_NAME = "ldp-survey analyst CA"


@dataclass(frozen=True)
class Issued:
    """A private key and its certificate."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Write the certificate (mode 0644) and the unencrypted key (mode 0600); never
        overwrite an existing file."""
        _write_new(key_path, self.key_pem(), 0o600)
        _write_new(cert_path, self.cert_pem(), 0o644)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not widen or narrow what we asked for
        os.write(fd, data)
    finally:
        os.close(fd)


def _validity(days: float, not_before: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    start = not_before or dt.datetime.now(dt.UTC) - CLOCK_SKEW
    return start, start + dt.timedelta(days=days)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ldp-survey"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def new_ca(
    common_name: str = "ldp-survey CA", *, days: float = 365, not_before: dt.datetime | None = None
) -> Issued:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days, not_before)
    name = _name(common_name)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, certificate)


def _leaf(
    ca: Issued,
    common_name: str,
    names: Sequence[x509.GeneralName],
    usages: Sequence[x509.ObjectIdentifier],
    days: float,
    not_before: dt.datetime | None,
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days, not_before)
    ca_public = ca.key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, certificate)


def issue_server(
    ca: Issued,
    hosts: Sequence[str] = SERVER_HOSTS,
    ips: Sequence[str] = SERVER_IPS,
    *,
    days: float = 365,
    not_before: dt.datetime | None = None,
) -> Issued:
    """The aggregator's certificate (EKU serverAuth); clients check ``hosts``/``ips`` against
    the name they dialled, so connect to e.g. ``localhost:PORT``."""
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in hosts]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return _leaf(ca, hosts[0], names, [ExtendedKeyUsageOID.SERVER_AUTH], days, not_before)


def issue_device(
    ca: Issued,
    device_id: str,
    *,
    days: float = 365,
    not_before: dt.datetime | None = None,
    usages: Sequence[x509.ObjectIdentifier] = (ExtendedKeyUsageOID.CLIENT_AUTH,),
) -> Issued:
    """A device certificate (EKU clientAuth, SAN DNS ``device_id``). ``usages`` exists so tests
    can build a certificate with the wrong key usage."""
    return _leaf(ca, device_id, [x509.DNSName(device_id)], usages, days, not_before)


def issue_analyst(analyst_ca: Issued, name: str, *, days: float = 365) -> Issued:
    """An analyst's client certificate (EKU clientAuth, CN and SAN DNS ``name``), from the
    analyst CA: its CN is the identity the audit log records."""
    return issue_device(analyst_ca, name, days=days)


def analyst_ids(count: int) -> list[str]:
    """The analyst names ``gen_pki`` assigns: analyst-0001, analyst-0002, ..."""
    return [f"analyst-{i:04d}" for i in range(1, count + 1)]


def device_ids(count: int) -> list[str]:
    """The device ids ``gen_pki`` assigns: device-0001, device-0002, ..."""
    return [f"device-{i:04d}" for i in range(1, count + 1)]


#: A DNS name a certificate may carry: dot-separated labels of letters, digits and inner
#: hyphens, 1-63 characters each, 253 in all (RFC 1123).
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def server_names(hosts: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The DNS names and IP addresses a server certificate carries: ``localhost`` and
    ``127.0.0.1`` and each of ``hosts`` (a name or an IPv4/IPv6 address, as devices dial it);
    ValueError naming one that is neither."""
    names, ips = list(SERVER_HOSTS), list(SERVER_IPS)
    for host in hosts:
        try:
            ips.append(str(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        labels = host.rstrip(".").split(".")
        if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
            raise ValueError(f"--host {host!r} is neither a DNS name nor an IP address")
        names.append(host.rstrip(".").lower())
    return tuple(dict.fromkeys(names)), tuple(dict.fromkeys(ips))


def renew_server(
    out: Path, ca_dir: Path, hosts: Sequence[str] = (), days: float = 365
) -> list[Path]:
    """A new server certificate signed by the CA in ``ca_dir`` (``ca.pem``, ``ca.key``), written
    as ``server.pem``/``server.key`` into ``out`` (never overwriting): devices trust the CA, not
    the certificate, so the server's certificate is replaced without any device noticing."""
    cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_dir / 'ca.key'} is not the EC key of a CA made here")
    names, ips = server_names(hosts)
    issued = issue_server(Issued(key, cert), names, ips, days=days)
    paths = (out / "server.pem", out / "server.key")
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise FileExistsError(f"refusing to overwrite {', '.join(existing)}")
    out.mkdir(parents=True, exist_ok=True)
    issued.write(*paths)
    return list(paths)


def write_pki(
    out: Path, devices: int = 1, days: float = 365, analysts: int = 0, hosts: Sequence[str] = ()
) -> list[Path]:
    """Create a CA, a server certificate (for ``localhost``, ``127.0.0.1`` and ``hosts``) and
    ``devices`` device certificates in ``out``, and with ``analysts`` an analyst CA and that
    many analyst certificates.

    Files: ``ca.pem``/``ca.key``, ``server.pem``/``server.key``, ``<device id>.pem``/``.key``,
    ``analyst-ca.pem``/``.key``, ``<analyst name>.pem``/``.key``. Keys are unencrypted with mode
    0600; existing files are never overwritten (FileExistsError).
    """
    if devices < 0 or analysts < 0 or days <= 0:
        raise ValueError("devices and analysts must be >= 0 and days > 0")
    names, ips = server_names(hosts)
    out.mkdir(parents=True, exist_ok=True)
    ca = new_ca(days=days)
    issued = {"ca": ca, "server": issue_server(ca, names, ips, days=days)}
    for device_id in device_ids(devices):
        issued[device_id] = issue_device(ca, device_id, days=days)
    if analysts:
        analyst_ca = new_ca(ANALYST_CA_NAME, days=days)
        issued["analyst-ca"] = analyst_ca
        for name in analyst_ids(analysts):
            issued[name] = issue_analyst(analyst_ca, name, days=days)
    paths = {stem: (out / f"{stem}.pem", out / f"{stem}.key") for stem in issued}
    existing = [str(p) for pair in paths.values() for p in pair if p.exists()]
    if existing:
        raise FileExistsError(f"refusing to overwrite {', '.join(existing)}")
    for stem, item in issued.items():
        item.write(*paths[stem])
    return [p for pair in paths.values() for p in pair]
