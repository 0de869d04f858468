"""``ldp-client simulate``: a population of simulated devices that randomize and upload like real
ones (``population``), their true distributions (``truths``) and signing keys (``keys``). Loaded
only for that command, so a device's own commands never pay for it.

May import ``client.device``, ``client.mechanisms``, ``client.survey``, ``client.budgeting``,
``client.cli.progress``, numpy, cryptography (lazily, for signing keys) and ``protos``; never the
aggregator.
"""
