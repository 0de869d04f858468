"""The gRPC server as a process, from start to stop: it opens the store, composes the
Collector (``aggregator.service.collector``) and the Analyst (``aggregator.service.analyst``) on
their own listeners (``app``), registers them at the byte level (``handlers``), one service per
port (``ports``), TLS and the PKI generator (``tls``, ``pki``), ``serve --workers N``'s processes
and their link to the single store writer (``workers``, ``store_link``), and the container
health probe (``healthcheck``).

The only room of the service that imports both others; may import ``aggregator.store`` (either
engine: it opens the store), ``aggregator.survey_file``, the shared ``aggregator.service``
modules, ``client`` and ``protos``; never ``aggregator.jobs``, ``aggregator.cli`` or
``aggregator.remote``.
"""
