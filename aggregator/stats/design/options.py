"""The words of design-based options, defined once for the statistics, the command line, the
service and the remote client: the variance methods, the Rao-Scott corrections and their
defaults (docs/designs.md). It imports nothing, so the command line and ``serve`` read it
without loading the statistics (SciPy)."""

from __future__ import annotations

LINEARIZATION = "linearization"
JACKKNIFE = "jackknife"
BOOTSTRAP = "bootstrap"
#: The variance methods (aggregator/stats/design/variance.py).
VARIANCES = (LINEARIZATION, JACKKNIFE, BOOTSTRAP)
#: The variance method when none is asked for.
DEFAULT_VARIANCE = LINEARIZATION
#: Replicates of a replicate variance (the bootstrap) when none are asked for.
DEFAULT_REPLICATES = 200

#: The corrections of a Rao-Scott test (aggregator/stats/design/rao_scott.py).
CORRECTIONS = ("F-unbiased", "F", "second-order", "first-order", "wald")
#: The correction when none is asked for: Rao-Scott second order as an F whose degrees of
#: freedom are estimated without the plug-in bias that makes R's "F" conservative at large k.
DEFAULT_CORRECTION = "F-unbiased"

BETA = "beta"
LOGIT = "logit"
WALD = "wald"
#: How a design estimate's interval is made (aggregator/stats/design/intervals.py): Korn-Graubard
#: ("beta") or logit on the share of reports supporting the category, inside [0, 1]; or "wald",
#: estimate -/+ t(df) s.e. as R's ``svymean``, which may leave [0, 1].
INTERVALS = (BETA, LOGIT, WALD)
#: The interval when none is asked for (docs/designs.md, "Intervals").
DEFAULT_INTERVAL = BETA

BELL_MCCAFFREY = "bell-mccaffrey"
AS_R = "as-r"
#: Small-sample corrections of a design estimate's variance and t reference
#: (aggregator/stats/design/small_sample.py): "bell-mccaffrey", bias-reduced linearization with
#: Satterthwaite degrees of freedom; "as-r", R ``survey``'s linearization and PSUs - strata.
SMALL_SAMPLE = (BELL_MCCAFFREY, AS_R)
#: The correction when none is asked for: R's intervals cover 0.90-0.93 with 10-14 PSUs
#: (docs/designs.md, "Few PSUs").
DEFAULT_SMALL_SAMPLE = BELL_MCCAFFREY
