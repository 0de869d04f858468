"""The report store's SQLite engine: the embedded default (WAL), one writer per store file."""
