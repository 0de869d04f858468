"""The durable report store: the SQLite log with its sufficient statistics, validation and
decoding of wire reports into those statistics, shards (export and import), and the
confirmation side's state of split surveys (preregistered plan, sealed results, holdout).

May import ``aggregator.histogram``, ``aggregator.errors``, ``client`` and ``protos``; never
``aggregator.service``, ``aggregator.stats`` or ``aggregator.jobs``.
"""
