"""The durable report store. This package's own modules are engine-neutral: the contract the
service uses (contract.py), what a store keeps and answers (model.py, errors.py), validation and
decoding of wire reports into sufficient statistics (ingest.py), shards (export and import), and
the rules every engine keeps (pinned definitions, releases, the confirmation side of split
surveys, per design key statistics). The engines sit beside them, ``sqlite/`` (the embedded
default) and ``postgres/`` (several ingest nodes); neither imports the other, and the neutral
modules import neither (nor sqlite3 or psycopg).

May import ``aggregator.histogram``, ``aggregator.errors``, ``client`` and ``protos``; never
``aggregator.service``, ``aggregator.stats``, ``aggregator.analysis`` or anything else above it,
nor gRPC.
"""
