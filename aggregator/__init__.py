"""The aggregator: histograms of randomized reports, estimates and local chi-square tests
(and, later, the gRPC server, storage, distributed jobs and CLI)."""
