"""Typed errors raised by the aggregator, so callers can tell user mistakes from bugs."""


class LdpError(Exception):
    """Base class of every error the aggregator raises on purpose."""


class InvalidInputError(LdpError, ValueError):
    """The input is malformed: wrong shape, non-finite numbers, counts that do not add up."""


class IncompatibleHistogramsError(InvalidInputError):
    """Two histograms of different mechanisms or parameters cannot be merged."""


class ClusteredReportsError(LdpError):
    """A test would run on reports that may come from several members of one household: they
    are not independent, so its p-value would be too small (privacy-accounting spec §D.3)."""


class InsufficientDataError(LdpError):
    """Too few reports to compute the requested estimate or test."""


class ConfirmationError(LdpError):
    """Explore, then confirm refused an operation: the confirmation side read before its results
    are sealed, a plan changed after registration, holdout and preregistered plan mixed, a
    holdout that is closed (docs/adaptive-analysis.md)."""
