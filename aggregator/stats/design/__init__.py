"""Design-based statistics of locally private reports: cells per (stratum, PSU), Hajek estimates,
linearization and replicate variances, Rao-Scott tests, post-stratification, raking, power under
a design effect (survey-design-and-monitoring spec)."""
