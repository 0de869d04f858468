"""The vocabulary of monitoring, apart from the statistics that need SciPy: what can be
monitored and the stopping rule's verdicts (the Monitor RPC's strings, docs/wire.md §8.8). The
service and the command line import these at start; the computation loads on first use."""

#: What can be monitored: frequencies or a mean score (confidence sequences only), or a
#: sequential test.
ANALYSES = ("frequencies", "goodness_of_fit", "independence", "two_sample", "mean_score")
#: The confidence-sequence-only analyses (no e-process).
SEQUENCES_ONLY = ("frequencies", "mean_score")
#: The stopping rule's verdicts.
CONTINUE, REJECT, STOP_AT_MAX_N = "continue", "reject", "stop at max_n"
