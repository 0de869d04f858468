"""TLS, mTLS and device enrollment as an operator runs them: the command-line entry points (in
process for the quick commands, real processes for the server and the device), a real server on
loopback, a PKI from gen_pki. Mistakes give one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import json
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
from aggregator_process import spawn_serve
from cli.test_cli import run

from aggregator import cli as aggregator_cli
from aggregator.service.server.pki import write_pki
from client.cli import main as client_cli

SURVEYS_TOML = """
[[survey]]
id = "secure"
require_device_auth = true

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "q2"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""


@pytest.fixture
def setup(tmp_path: Path):
    """A survey requiring device auth, a PKI with one device, an empty store path."""
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    write_pki(tmp_path / "pki", devices=1, days=1)
    return config, tmp_path / "pki", tmp_path / "reports.sqlite"


def call(capsys, main, *args: str, status: int = 0) -> str:
    """Run a CLI entry point in process; check its exit status; return stdout. A non-zero
    status must come with exactly one line on stderr."""
    assert main(list(args)) == status
    out, err = capsys.readouterr()
    if status:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        return err
    return out


@contextmanager
def serving(tmp_path: Path, *args: str):
    process, port = spawn_serve(tmp_path / "port", *args)
    try:
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def test_serve_refuses_unclear_transport_and_auth_settings(setup, tmp_path, capsys):
    config, pki, db = setup
    base = ["serve", "--config", str(config), "--db", str(db)]
    tls = ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]
    devices = ["--devices", str(tmp_path / "devices.sqlite")]
    cases = [
        ([], "--tls-cert and --tls-key"),
        (["--insecure", *tls], "cannot be combined"),
        (["--tls-cert", str(pki / "server.pem")], "go together"),
        (["--client-ca", str(pki / "ca.pem")], "no transport security"),
        (
            ["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(pki / "server.key")],
            "cannot read server certificate",
        ),
        (
            ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "device-0001.key")],
            "does not match",
        ),
        (tls, "pass --devices"),
        ([*tls, *devices], "device registry not found"),
    ]
    for extra, fragment in cases:
        assert fragment in call(capsys, aggregator_cli.main, *base, *extra, status=2)
    assert not db.exists()


def test_enrollment_commands(tmp_path, capsys):
    state = tmp_path / "device.sqlite"
    registry = tmp_path / "devices.sqlite"
    shown = json.loads(call(capsys, client_cli.main, "device-key", "--state", str(state), "--json"))
    device_id = shown["device_id"]
    public = tmp_path / "device.pub"
    call(capsys, client_cli.main, "device-key", "--state", str(state), "--out", str(public))
    assert public.read_text() == shown["public_key_pem"]
    agg = aggregator_cli.main
    enroll = ["enroll", "--devices", str(registry), "--public-key", str(public)]
    assert device_id in call(capsys, agg, *enroll, "--device-id", device_id)
    assert "already enrolled" in call(capsys, agg, *enroll)
    listing = json.loads(call(capsys, agg, "devices", "--devices", str(registry), "--json"))
    assert [(d["device_id"], d["revoked_at"]) for d in listing] == [(device_id, None)]
    assert "not belong" in call(capsys, agg, *enroll, "--device-id", "dev-x", status=2)
    bad_key = ["enroll", "--devices", str(registry), "--public-key", str(tmp_path / "none")]
    assert "cannot read public key" in call(capsys, agg, *bad_key, status=2)
    call(capsys, agg, "revoke", "--devices", str(registry), "--device-id", device_id)
    assert "revoked" in call(capsys, agg, "devices", "--devices", str(registry))
    assert "revoked" in call(capsys, agg, *enroll, status=2)
    missing = ["devices", "--devices", str(tmp_path / "none.sqlite")]
    assert "not found" in call(capsys, agg, *missing, status=2)


@pytest.mark.slow
def test_mtls_and_signed_uploads_end_to_end(setup, tmp_path):
    config, pki, db = setup
    state = tmp_path / "device.sqlite"
    public = tmp_path / "device.pub"
    registry = tmp_path / "devices.sqlite"
    run("client", "device-key", "--state", str(state), "--out", str(public))
    run("agg", "enroll", "--devices", str(registry), "--public-key", str(public))
    server_args = [
        "--config", str(config), "--db", str(db), "--devices", str(registry),
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--client-ca", str(pki / "ca.pem"),
    ]  # fmt: skip
    with serving(tmp_path, *server_args) as port:
        common = ["--server", f"localhost:{port}", "--state", str(state), "--tls-ca"]
        common += [str(pki / "ca.pem")]
        device_cert = ["--tls-cert", str(pki / "device-0001.pem")]
        device_cert += ["--tls-key", str(pki / "device-0001.key")]
        answer = ["--survey", "secure", "--question", "q", "--answer", "b", "--json"]
        first = run("client", "submit", *common, *device_cert, *answer, "--budget", "4")
        assert json.loads(first.stdout)["flush"]["accepted"] == 1
        # Without its certificate the device cannot tell a refused handshake from a missing
        # signal: it answers offline from its cached definition, and the flush says why it fails.
        second = [*answer[:3], "q2", *answer[4:]]  # one answer per question and device
        no_cert = run("client", "submit", *common, "--timeout", "2", *second)
        assert json.loads(no_cert.stdout)["offline"] is True
        flush = ["flush", *common, "--timeout", "2"]
        refused = run("client", *flush, check=False)
        assert refused.returncode == 1 and "UNAVAILABLE" in refused.stderr
        assert "still pending 1" in refused.stdout and "Traceback" not in refused.stderr
        assert "accepted 1" in run("client", *flush, *device_cert).stdout


def test_client_tls_flags_need_a_ca(capsys):
    args = ["simulate", "--server", "x:1", "--survey", "s", "--devices", "1", "--tls-cert", "c"]
    assert "need --tls-ca" in call(capsys, client_cli.main, *args, status=2)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "--insecure for plaintext"),  # neither TLS nor an explicit plaintext flag
        (["--insecure", "--tls-ca", "ca.pem"], "cannot be combined"),
    ],
)
def test_client_plaintext_only_with_insecure(capsys, flags, message):
    args = ["simulate", "--server", "x:1", "--survey", "s", "--devices", "1", *flags]
    assert message in call(capsys, client_cli.main, *args, status=2)
