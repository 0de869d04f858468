"""Scale-out aggregation jobs on Apache Beam (the optional ``[beam]`` extra).

``pipeline`` builds the Beam graph; ``inputs`` and ``job_cli`` use Beam's file systems and
options; the other modules are the numpy building blocks it distributes (shard framing, record
classification, partial statistics, deduplication, results). May import ``aggregator.store``,
``aggregator.stats``, ``aggregator.analysis`` (design data), ``aggregator.survey_file``,
``client`` (``client.cli.progress`` for bars) and ``protos``; never ``aggregator.service``. The
service never imports this package; ``ldp-aggregator job`` imports it lazily. See docs/beam-job.md.
"""
