"""The aggregator: it receives randomized reports, stores them durably, and turns them into
estimates and local chi-square tests.

``service/`` (gRPC) and ``store/`` (durable log, validation, shards) feed ``histogram.py``;
``stats/`` reads only histograms; ``jobs/`` (Beam) reuses store and stats. Imports point one way:
aggregator -> client -> protos; ``service`` never imports ``jobs``; ``stats`` never imports
``service``, ``store`` or ``jobs``. See docs/architecture.md.
"""
