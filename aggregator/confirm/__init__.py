"""Explore, then confirm (privacy-accounting spec C.2, C.6): a preregistered confirmatory family
run once with Holm or Bonferroni, and SparseValidate for confirmatory tests that could not be
fixed in advance. Local noise protects respondents, not conclusions: these protect conclusions.

May import ``aggregator.stats``, ``aggregator.survey_file`` and the top-level modules, and
``client``; never ``aggregator.service``, ``aggregator.store`` or ``aggregator.jobs`` (the caller
loads the confirmation side's histograms and keeps the sealed results).
"""
