"""Reading the shared log: a survey's reports in report-id order through a server-side cursor,
for ``PostgresStore.iter_reports`` and the export's one-snapshot read (``design.Snapshot``)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg


def read_reports(
    conn: psycopg.Connection,
    survey_id: str,
    question_id: str | None = None,
    batch: int = 10000,
    side: int | None = None,
) -> Iterator[tuple[bytes, str, bytes, str]]:
    """(report_id, question_id, payload, group) of a survey (one question's, one side's) in
    report_id order, through a server-side cursor in ``conn``'s transaction."""
    sql = "SELECT report_id, question_id, payload, group_value FROM reports"
    sql += " WHERE survey_id = %s"
    params: tuple[str | int, ...] = (survey_id,)
    if question_id is not None:
        sql += " AND question_id = %s"
        params += (question_id,)
    if side is not None:
        sql += " AND side = %s"
        params += (side,)
    with conn.cursor(name="reports") as cursor:
        cursor.itersize = batch
        cursor.execute(sql + " ORDER BY report_id", params)
        for report_id, question, payload, group in cursor:
            yield bytes(report_id), question, bytes(payload), group
