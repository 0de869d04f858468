"""The durable report store: the SQLite log with its sufficient statistics, validation and
decoding of wire reports into those statistics, and shards (export and import).

May import ``aggregator.histogram``, ``aggregator.errors``, ``client`` and ``protos``; never
``aggregator.service``, ``aggregator.stats`` or ``aggregator.jobs``.
"""
