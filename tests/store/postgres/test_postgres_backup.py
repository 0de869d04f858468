"""Backup and restore of a PostgreSQL store with PostgreSQL's own tools (docs/operations.md,
"Backup and restore of a PostgreSQL store"): ``pg_dump`` of a store a node has filled and
released from, ``pg_restore`` into a new database, and a node started on the copy answers the
same estimate, from the same released snapshot."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from confirm.test_confirm_flow import CONFIG, MOOD, reports
from conftest import ServerThread

from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

EXPLORATION = ldp_pb2.EXPLORATION


def estimate(server: ServerThread) -> tuple:
    analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
    answer = analyst.Estimate(
        ldp_pb2.EstimateRequest(survey_id="split", question_id="mood"), timeout=30
    )
    return answer.n, list(answer.frequencies), list(answer.ci_low), list(answer.ci_high)


@pytest.mark.slow  # two servers, pg_dump and pg_restore
def test_a_dump_restored_into_a_new_database_serves_the_same_estimate(
    tmp_path: Path, postgres, postgres_url: str
) -> None:
    config = tmp_path / "surveys.toml"
    config.write_text(CONFIG.format(fraction=0.5))
    node = ServerThread(config, tmp_path / "node-a", store_url=postgres_url).start()
    try:
        question = node.surveys["split"].question("mood")
        collector = ldp_pb2_grpc.CollectorStub(grpc.insecure_channel(node.target))
        collector.Upload(
            ldp_pb2.UploadRequest(reports=reports(question, MOOD, 300, EXPLORATION, 1)), timeout=30
        )
        before = estimate(node)  # releases a snapshot of 300
        collector.Upload(
            ldp_pb2.UploadRequest(reports=reports(question, MOOD, 5, EXPLORATION, 2)), timeout=30
        )  # below the next step of min_batch_size: still 300 released
        dump = tmp_path / "store.dump"
        subprocess.run(
            [str(postgres.bindir / "pg_dump"), "--format=custom", f"--file={dump}", postgres_url],
            check=True,
            capture_output=True,
        )
    finally:
        node.stop()
    restored_url = postgres.new_database()
    subprocess.run(
        [str(postgres.bindir / "pg_restore"), f"--dbname={restored_url}", str(dump)],
        check=True,
        capture_output=True,
    )
    restored = ServerThread(config, tmp_path / "node-r", store_url=restored_url).start()
    try:
        assert before[0] == 300
        assert estimate(restored) == before
    finally:
        restored.stop()

    from aggregator.store.postgres.engine import PostgresStore

    with PostgresStore(restored_url) as store:
        assert store.count_reports("split") == 305  # every report, beyond the release
