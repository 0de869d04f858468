"""The Collector: what devices call. Survey definitions and uploads (``servicer``), checked on
their raw bytes before protobuf parses them (``wire``) and bounded per stream (``streams``),
device signatures against the registry of enrolled keys (``device_auth``, ``registry``), abuse
limits and cap counts at rest (``limits``, ``cap_file``), the answers written straight to bytes
(``answers``), and what operators see of each upload: Prometheus metrics and an access log
(``metrics``, ``observe``).

May import ``aggregator.store`` (its engine-neutral contract and rules, and the SQLite file
kinds of the collector's own files: the device registry and the cap counts), the shared
``aggregator.service`` modules, ``aggregator.survey_file``, ``client`` and ``protos``; never
``aggregator.service.analyst`` or ``aggregator.service.server`` (which composes it), nor
``aggregator.stats``: nothing on the upload path analyses.
"""
