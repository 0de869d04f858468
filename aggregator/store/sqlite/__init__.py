"""The report store's SQLite engine: the embedded default (WAL), one writer per store file. It
implements aggregator/store/contract.py by the rules of the neutral modules beside this package,
and never imports the PostgreSQL engine."""
