"""Scale-out aggregation jobs on Apache Beam (the optional ``[beam]`` extra).

Only :mod:`aggregator.jobs.pipeline` imports ``apache_beam``; the other modules are the numpy
building blocks it distributes (shard framing, record classification, partial statistics,
deduplication, results). The service never imports this package; ``ldp-aggregator job`` imports
it lazily. See docs/beam-job.md.
"""
