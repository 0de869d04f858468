"""The confirmation side's rules, the same on every engine: the preregistered plan (its text,
SHA-256 and time), the sealed results, or the reusable holdout's counters and query log.

One mode per survey: a preregistered plan ("plan") or SparseValidate ("holdout"), whichever is
used first; the other is then refused. A registered plan is final (registering the identical
text again is a no-op). The confirmation side is readable (estimates, tests, reports) only once
a plan's results are sealed, never in holdout mode. Sealing and holdout queries compute their
tests from a read snapshot (:class:`Snapshot`), never inside a write transaction; the result is
committed in a short write transaction that first checks the state is still the one read
(compare-and-set: same plan, not sealed, same confirmation-side counts; the holdout's counters
unchanged), and a sealed survey's confirmation side takes no more reports. Each engine keeps the
state with its own statements (sqlite/confirmations.py, postgres/confirm.py).

The statistics are computed by the caller (``compute``), since the store never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aggregator.errors import ConfirmationError
from aggregator.histogram import Histogram
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.errors import StoreError
from client.survey import SurveySpec

#: The holdout's family-wise level, m queries and B rejections when nothing else is asked for.
DEFAULT_HOLDOUT = {"alpha": 0.05, "m": 20, "budget": 3}
#: (question id, group value) -> its histogram on one side; group '' pools every group, and a
#: survey with a group label also has each of its groups.
Histograms = dict[tuple[str, str], Histogram]
#: question id -> its per (group, design key) statistics on one side, of a survey with a
#: sampling design (the design-based tests of a plan or a holdout read them).
Designs = dict[str, list[KeyStatistics]]


@dataclass(frozen=True)
class Confirmation:
    """A survey's row: its mode, plan, sealed record (JSON text) or holdout state (dict)."""

    survey_id: str
    mode: str
    plan_sha256: str | None
    plan: str | None
    registered_at: str
    sealed: str | None
    sealed_at: str | None
    holdout: dict | None

    def plan_text(self) -> str:
        """The registered plan (mode "plan"); a plan row without one is a damaged store."""
        if self.plan is None:
            raise StoreError(f"survey {self.survey_id}: a confirmation plan row without its plan")
        return self.plan

    def sealed_record(self) -> str:
        """The sealed results (JSON text) of a sealed plan; asked of an unsealed row, a bug."""
        if self.sealed is None:
            raise StoreError(f"survey {self.survey_id}: its confirmatory results are not sealed")
        return self.sealed

    def holdout_state(self) -> dict:
        """The holdout's state (mode "holdout"); a holdout row without one is a damaged store."""
        if self.holdout is None:
            raise StoreError(f"survey {self.survey_id}: a holdout row without its state")
        return self.holdout


def check_state_readable(survey: SurveySpec, current: Confirmation | None) -> None:
    """ConfirmationError unless the confirmation side of ``survey``, in state ``current``, may
    be read directly (every engine's rule: only once a preregistered plan is sealed)."""
    if current is not None and current.sealed is not None:
        return
    if current is not None and current.mode == "holdout":
        why = "it is a reusable holdout: only `holdout` queries may use it"
    elif current is None:
        why = "no confirmatory plan is registered (`preregister`, then `confirm`)"
    else:
        why = "its preregistered plan has not run yet (`confirm` runs it once and seals it)"
    raise ConfirmationError(
        f"survey {survey.id}: the confirmation side cannot be read before its results are "
        f"sealed; {why}"
    )


@dataclass(frozen=True)
class Snapshot:
    """What a seal or a holdout query is computed from: the survey's confirmation state, its
    confirmation-side histograms and (a survey with a sampling design) per design key
    statistics, read in one read transaction (one consistent snapshot), off the store's writer.
    The design statistics are written with the reports they sum, so unchanged counts mean
    unchanged design statistics too."""

    state: Confirmation | None
    histograms: Histograms
    designs: Designs = field(default_factory=dict)

    def counts(self) -> dict[tuple[str, str], int]:
        """n of every (question, group) read: what a seal's commit checks is still current."""
        return {key: hist.n for key, hist in self.histograms.items()}


class StateChangedError(ConfirmationError):
    """The state read for a seal or holdout query changed before its result was committed (a
    concurrent query, seal or confirmation-side upload): nothing was written; compute again
    from a fresh snapshot."""


#: How many times seal and holdout_query compute again after a concurrent change.
ATTEMPTS = 3


def seal_plan(snap: Snapshot, survey: SurveySpec) -> str | None:
    """The plan text to run for a seal from ``snap``; None when it is sealed already (its
    stored record is the answer). No plan registered, or holdout mode: ConfirmationError."""
    current = snap.state
    if current is None or current.mode != "plan":
        what = "no plan is registered" if current is None else "it is a reusable holdout"
        raise ConfirmationError(f"survey {survey.id}: nothing to confirm: {what}")
    return None if current.sealed is not None else current.plan_text()


def unchanged_plan(
    survey_id: str, current: Confirmation | None, before: Confirmation
) -> Confirmation:
    """The compare-and-set check of a seal on the state read in its write transaction: that
    state, holding the plan of ``before`` (sealed meanwhile by another call, or not);
    StateChangedError when the plan changed."""
    if current is None or current.mode != "plan" or current.plan_sha256 != before.plan_sha256:
        raise StateChangedError(f"survey {survey_id}: its plan changed while it was run")
    return current


def check_counts_unchanged(survey_id: str, counts: dict, now: dict) -> None:
    """StateChangedError unless the confirmation side holds the counts the record was computed
    from (``counts``: (question, group) -> n of the snapshot; ``now``: the same, committed)."""
    if now != counts:
        raise StateChangedError(
            f"survey {survey_id}: confirmation-side reports arrived while its plan ran"
        )


def seal_with_retries(
    survey: SurveySpec,
    take: Callable[[], Snapshot],
    commit: Callable[[Snapshot, dict], tuple[Confirmation, bool]],
    compute: Callable[[str, Snapshot], dict],
    prepare: Callable[[], None] | None = None,
) -> tuple[Confirmation, bool]:
    """The seal loop every engine shares: ``take`` a snapshot, answer an already sealed survey
    with its record, else ``compute`` the record and ``commit`` it (compare-and-set), again from
    a fresh snapshot after a concurrent change, up to ATTEMPTS times. ``prepare`` runs once,
    before the first computation, and the snapshot is taken again after it (an engine that
    closes the side first)."""
    for attempt in range(1, ATTEMPTS + 1):
        snap = take()
        plan = seal_plan(snap, survey)
        if plan is not None and prepare is not None:
            prepare()
            prepare = None
            snap = take()
            plan = seal_plan(snap, survey)
        if plan is None:
            assert snap.state is not None
            return snap.state, True
        try:
            return commit(snap, compute(plan, snap))
        except StateChangedError:
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def holdout_state(snap: Snapshot, survey: SurveySpec, parameters: dict | None) -> dict:
    """The holdout state a query computes from (``snap``'s, or a new holdout opened with
    ``parameters``, None: the defaults). A plan registered, or parameters that differ from the
    open holdout's: ConfirmationError."""
    current = snap.state
    if current is not None and current.mode != "holdout":
        raise ConfirmationError(
            f"survey {survey.id}: a confirmatory plan is registered (sha256 "
            f"{current.plan_sha256}); the holdout is not available; one mode per survey"
        )
    if current is None:
        held = {**(parameters or DEFAULT_HOLDOUT), "answered": 0, "rejections": 0}
    else:
        held = current.holdout_state()
    fixed = {key: held[key] for key in DEFAULT_HOLDOUT}
    if parameters is not None and any(parameters[k] != v for k, v in fixed.items()):
        raise ConfirmationError(
            f"survey {survey.id}: the holdout was opened with alpha {fixed['alpha']:g}, "
            f"m {fixed['m']}, B {fixed['budget']}; they cannot change"
        )
    return held
