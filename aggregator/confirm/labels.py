"""The label of a result computed on the confirmation side outside its sealed family.

Kept free of imports so that every part that shows such a result (the command line, the
Analyst RPCs, the report) can label it without loading the statistics.
"""

#: Everything read from the confirmation side of a split survey after sealing, except the
#: sealed family itself: an estimate, a test, a report section (CLI, JSON, reports, RPCs).
NOT_PREREGISTERED = (
    "not preregistered: computed on the confirmation side outside its sealed family; not a "
    "confirmatory result (docs/adaptive-analysis.md)"
)
