"""Each reason validation gives for refusing a report has one status code on the wire, and that
code is the one docs/wire.md documents for it (§5, §8.2): the table in
aggregator/service/status.py is checked against the normative text, row by row."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from aggregator.service.status import STATUS_OF, status_of
from aggregator.store.checks import Rejection

WIRE = (Path(__file__).resolve().parents[2] / "docs" / "wire.md").read_text()

#: For each reason, words of the wire.md table row that documents it.
DOCUMENTED_AS = {
    Rejection.UNKNOWN_SURVEY: "unknown survey or question",
    Rejection.UNKNOWN_QUESTION: "unknown survey or question",
    Rejection.STALE_DEFINITION: "randomized under another question definition",
    Rejection.WRONG_SIDE: "a side that does not fit the survey",
    Rejection.WRONG_GROUP: "not one of the survey's group values",
    Rejection.WRONG_DESIGN_KEY: "not in the survey's sampling frame",
    Rejection.MALFORMED: "payload of the wrong length",
    Rejection.REUSED_ID: "an id reused for other content in the request",
    Rejection.OUT_OF_RANGE: "a value the mechanism cannot produce",
    Rejection.TOO_MANY_CELLS: "reports of one support-count question",
    Rejection.UNSIGNED: "§7",
    Rejection.ANSWERED_BEFORE: "a second report (another id) of a device for a question",
}


def documented_codes(words: str) -> set[str]:
    """The status codes of the wire.md table rows (§5 limits, §8.2 Upload) containing words."""
    rows = [line for line in WIRE.splitlines() if line.startswith("|") and words in line]
    return {
        code.name
        for code in grpc.StatusCode
        if any(re.search(rf"\b{code.name}\b", row) for row in rows)
    }


def test_every_reason_has_a_status_code():
    assert set(STATUS_OF) == set(Rejection)


@pytest.mark.parametrize("reason", list(Rejection), ids=lambda reason: reason.name)
def test_each_code_is_the_one_wire_md_documents(reason):
    codes = documented_codes(DOCUMENTED_AS[reason])
    assert codes, f"wire.md has no table row with {DOCUMENTED_AS[reason]!r}"
    assert status_of(reason).name in codes


def test_the_check_sees_a_wrong_code():
    """Control: a reason mapped to another code than its documented one is caught."""
    assert "NOT_FOUND" not in documented_codes(DOCUMENTED_AS[Rejection.OUT_OF_RANGE])
