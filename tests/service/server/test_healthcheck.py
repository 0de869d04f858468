"""The container health probe (python -m aggregator.service.server.healthcheck) against real
servers:
plaintext, mTLS, a draining server and nothing listening."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from aggregator.service.server.healthcheck import main
from aggregator.service.server.tls import server_credentials
from tests.aggregator_process import free_port
from tests.conftest import ServerThread


def probe(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "aggregator.service.server.healthcheck", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_serving_server_passes(server):
    done = probe("--server", server.target, "--insecure")
    assert done.returncode == 0 and done.stdout.strip() == "SERVING", done.stderr


def test_mtls_needs_the_client_certificate(tmp_path, survey_file, pki):
    credentials = server_credentials(pki.cert("server"), pki.key("server"), pki.cert("ca"))
    running = ServerThread(survey_file, tmp_path / "r.sqlite", credentials=credentials).start()
    try:
        target = f"localhost:{running.port}"
        good = probe(
            "--server",
            target,
            "--tls-ca",
            str(pki.cert("ca")),
            "--tls-cert",
            str(pki.cert("device")),
            "--tls-key",
            str(pki.key("device")),
        )
        assert good.returncode == 0 and good.stdout.strip() == "SERVING", good.stderr
        refused = probe("--server", target, "--tls-ca", str(pki.cert("ca")), "--timeout", "2")
        assert refused.returncode == 2 and refused.stderr.startswith("healthcheck: ")
        assert "Traceback" not in refused.stderr
    finally:
        running.stop()


def test_a_draining_server_is_not_serving(server, capsys):
    asyncio.run_coroutine_threadsafe(
        server._running.health.enter_graceful_shutdown(), server._loop
    ).result(timeout=5)
    assert main(["--server", server.target, "--insecure"]) == 1
    assert capsys.readouterr().out.strip() == "NOT_SERVING"


def test_nothing_listening_and_wrong_flags_are_one_line(capsys):
    port = free_port()
    assert main(["--server", f"127.0.0.1:{port}", "--insecure", "--timeout", "1"]) == 2
    assert capsys.readouterr().err.startswith(f"healthcheck: 127.0.0.1:{port}: UNAVAILABLE")
    assert main(["--server", "x:1"]) == 2
    assert "exactly one of --insecure and --tls-ca" in capsys.readouterr().err
    assert main(["--server", "x:1", "--tls-ca", "/nonexistent/ca.pem"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
