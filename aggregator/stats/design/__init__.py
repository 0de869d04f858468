"""Design-based statistics of locally private reports (survey-design-and-monitoring spec D): the
cells per (stratum, PSU) and Hajek estimates (``cells``), linearization and replicate variances
(``variance``), the design-based estimate (``estimate``), Rao-Scott and Wald tests
(``rao_scott``), post-stratification (``calibration``) and raking (``raking``), power under a
design effect (``power``), cells from a store's per-key sums (``keys``) and simulated two-stage
samples for validation (``simulation``).

Part of ``aggregator.stats``, with its rules: may import ``aggregator.histogram``,
``aggregator.errors``, ``client.mechanisms``, numpy and scipy; never a store, the service, the
survey file layer or the command line.
"""
