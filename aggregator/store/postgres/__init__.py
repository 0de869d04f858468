"""The report store on a shared PostgreSQL database: several stateless ingest nodes (``serve
--store postgresql://...``), one log and one set of sufficient statistics, with the semantics of
the embedded SQLite engine. Needs the ``[postgres]`` extra (psycopg 3); docs/operations.md,
"Several ingest nodes".

May import the neutral modules of ``aggregator.store``, ``aggregator.histogram``,
``aggregator.errors``, ``client``, ``protos`` and psycopg; never ``aggregator.store.sqlite`` (nor
sqlite3), nor anything above the store.
"""
