"""The device runtime: the privacy ledger (charged before any randomization), the durable outbox,
the reporter that ties them together, the gRPC transport, the device key and upload signature,
TLS settings and the device's SQLite file.

May import ``client.mechanisms``, ``client.survey`` and ``protos``; never ``aggregator``.
"""
