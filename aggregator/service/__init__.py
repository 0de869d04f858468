"""The gRPC service: servicers, worker processes and their link to the single store writer,
admission and abuse limits, device authentication and the device registry, TLS.

May import ``aggregator.store``, ``aggregator.survey_file.config``, ``aggregator.histogram``, lazily
``aggregator.stats`` and ``aggregator.confirm`` (Analyst RPCs), ``client`` and ``protos``;
never ``aggregator.jobs``.
"""
