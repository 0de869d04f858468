"""The report store's SQLite engine, the embedded default: one file in WAL mode, one writer.
The writer with group commit (``report_store``) over the schema and its migrations (``schema``),
connections and transactions (``connection``), the append-only log (``log``), each question's
statistics (``statistics``), the report-id index in memory and in the file (``id_index``,
``saved_index``); the neutral rules applied with SQLite statements (``pins``, ``releases``,
``release_history``, ``confirmations``, ``design_statistics``, ``design_releases``,
``design_import``) and the Analyst's state through the writer (``analysis``); a read-only view
(``reader``), files that know their kind (``file_kind``), one holder per store (``lock``),
failure detection (``integrity``) and online backup (``backup``).

May import the neutral modules of ``aggregator.store``, ``aggregator.histogram``,
``aggregator.errors``, ``client`` and ``protos``; never ``aggregator.store.postgres`` (nor
psycopg), nor anything above the store.
"""
