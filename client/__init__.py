"""Everything a device runs: ``mechanisms/`` (the randomizers, numpy only), ``device/`` (ledger,
outbox, reporter, transport, keys, TLS), the shared survey model and the ``ldp-client`` CLI.

May import only ``protos`` and light dependencies; never ``aggregator``, scipy, Apache Beam or
matplotlib (an embedded device installs little).
"""

__version__ = "0.2.0"
