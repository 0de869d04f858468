"""Study planning for people: the power of a study with n reports, or the n a target power needs,
per mechanism or ranked over all, with a survey design's effect (``study``), and the same for a
comparison of groups, two- or k-sample (``groups``).

May import ``aggregator.stats``, ``aggregator.errors``, matplotlib (lazily, for curves) and
``client``; never ``aggregator.store``, ``aggregator.analysis``, ``aggregator.service``,
``aggregator.jobs`` or ``aggregator.cli``: planning needs no data.
"""
