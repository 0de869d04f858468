"""Enrolling and revoking while the server runs: a real ``serve --devices`` process (one process
and ``--workers 2``), the real ``enroll``/``revoke`` commands, signed uploads over loopback. The
very next upload after the command returns is judged by it: no restart, no waiting."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
from aggregator_process import spawn_serve
from cli_runner import run_cli
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from service.collector.test_device_auth import SURVEYS_TOML, report

from aggregator.service.collector.registry import DeviceRegistry, LiveKeys
from client.device.keys import DeviceKey
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

CALLS = 8  # uploads per check, each on its own connection (so --workers spreads them)


def upload(target: str, key: DeviceKey) -> str:
    """One signed upload on a fresh connection: "ACCEPTED" or the refusal's status code."""
    batch = [report()]
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        try:
            reply = stub.Upload(
                ldp_pb2.UploadRequest(reports=batch), metadata=key.sign_upload(batch), timeout=10
            )
        except grpc.RpcError as exc:
            return exc.code().name
    return ldp_pb2.ReportStatus.Name(reply.results[0].status)


def enroll(registry: Path, key: DeviceKey, tmp_path: Path) -> None:
    pem = tmp_path / f"{key.device_id}.pem"
    pem.write_bytes(key.public_key_pem())
    run_cli("agg", "enroll", "--devices", registry, "--public-key", pem, check=True)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_enroll_and_revoke_count_from_the_next_upload(tmp_path, workers):
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    registry = tmp_path / "devices.sqlite"
    first = DeviceKey(Ed25519PrivateKey.generate())
    enroll(registry, first, tmp_path)
    process, port = spawn_serve(
        tmp_path / "port",
        *("--config", str(config), "--db", str(tmp_path / "reports.sqlite"), "--insecure"),
        *("--devices", str(registry), "--workers", workers),
    )
    target = f"127.0.0.1:{port}"
    try:
        newcomer = DeviceKey(Ed25519PrivateKey.generate())
        assert upload(target, first) == "ACCEPTED"
        assert upload(target, newcomer) == "UNAUTHENTICATED"

        enroll(registry, newcomer, tmp_path)
        assert [upload(target, newcomer) for _ in range(CALLS)] == ["ACCEPTED"] * CALLS

        run_cli("agg", "revoke", "--devices", registry, "--device-id", first.device_id, check=True)
        assert [upload(target, first) for _ in range(CALLS)] == ["UNAUTHENTICATED"] * CALLS
        assert upload(target, newcomer) == "ACCEPTED"
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


def test_live_keys_read_the_file_only_while_it_is_ahead(tmp_path):
    """Between reloads a device's key comes from its own row; once the snapshot has caught up,
    look-ups are served from memory again."""
    path = tmp_path / "devices.sqlite"
    one, two = (DeviceKey(Ed25519PrivateKey.generate()) for _ in range(2))
    with DeviceRegistry(path, create=True) as registry:
        registry.enroll(one.public_key_pem())

        def load() -> dict:
            return registry.active_keys()

        keys = LiveKeys(str(path), load)
        try:
            assert set(keys) == {one.device_id} and keys.changed() is None
            with DeviceRegistry(path) as other:
                other.enroll(two.public_key_pem())
                other.revoke(one.device_id)
            version = keys.changed()
            assert version is not None
            assert keys.get(one.device_id) is None and two.device_id in keys
            keys.replace(load(), version)
            assert keys.changed() is None and set(keys) == {two.device_id}
        finally:
            keys.close()
