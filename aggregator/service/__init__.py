"""The gRPC service: servicers, worker processes and their link to the single store writer,
admission and abuse limits, device authentication and the device registry, TLS.

May import ``aggregator.store``, ``aggregator.survey_file``, ``aggregator.analysis``,
``aggregator.histogram``, lazily ``aggregator.stats`` and ``aggregator.confirm`` (Analyst RPCs),
``client`` and ``protos``; never ``aggregator.jobs``, ``aggregator.cli`` or ``aggregator.remote``.

Three rooms: ``server/`` composes ``collector/`` and ``analyst/`` and is the only one that imports
both; those two never import each other nor ``server/``. What both use sits here, beside them
(``status.py``: how a servicer ends a call on a refusal).
"""
