"""The report store on a shared PostgreSQL database: several stateless ingest nodes (``serve
--store postgresql://...``), one log and one set of sufficient statistics, with the semantics of
the embedded SQLite store (its report_store.py). Needs the ``[postgres]`` extra (psycopg 3);
docs/operations.md, "Several ingest nodes"."""
