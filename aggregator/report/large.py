"""Large domains in the report: a question with more than ``LARGE_K`` categories shows its
``TOP`` largest estimates (a sorted plot and a table) and links its full table as CSV, so a
2,000-category section stays readable and small."""

from __future__ import annotations

import csv
import io
from urllib.parse import quote

import numpy as np

from aggregator.presentation.numbers import fixed
from aggregator.report.content import QuestionSection

#: More categories than this: the section shows the top ones and links the full table.
LARGE_K = 50
#: How many categories a large section shows, largest estimate first.
TOP = 30


def is_large(section: QuestionSection) -> bool:
    """A released section with a per-category estimate over more than LARGE_K categories."""
    return section.estimate is not None and section.question.k > LARGE_K


def shown(section: QuestionSection) -> np.ndarray:
    """The category indices a section's plot and table show, in display order: every category
    in the question's order, or for a large section the TOP largest estimates, largest first
    (ties in the question's order)."""
    est = section.estimate
    assert est is not None
    if not is_large(section):
        return np.arange(section.question.k)
    order = np.argsort(-est.frequencies, kind="stable")
    return order[:TOP]


def csv_name(stem: str, section: QuestionSection) -> str:
    """The file name of a section's full table written beside a report named ``stem``.*."""
    return f"{stem}-{section.question.id}.csv"


def full_table_csv(section: QuestionSection) -> str:
    """Every category of a released section as CSV: estimate, standard error, interval and
    projected estimate, then each released group's estimate and interval (a withheld group's
    cells are empty, its header says why)."""
    est = section.estimate
    assert est is not None
    projected = est.projected()
    header = ["category", "estimate", "standard_error", "ci_low", "ci_high", "projected"]
    for column in section.groups:
        if column.estimate is None:
            header.append(f"{column.group}: {column.withheld}")
        else:
            header += [f"{column.group} {name}" for name in ("estimate", "ci_low", "ci_high")]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for j, label in enumerate(section.question.labels):
        row = [
            label,
            *(fixed(v[j], 6) for v in (est.frequencies, est.standard_errors, est.ci_low)),
            fixed(est.ci_high[j], 6),
            fixed(projected[j], 6),
        ]
        for column in section.groups:
            group = column.estimate
            if group is None:
                row.append("")
            else:
                row += [fixed(v[j], 6) for v in (group.frequencies, group.ci_low, group.ci_high)]
        writer.writerow(row)
    return buffer.getvalue()


def data_url(text: str) -> str:
    """A CSV as a ``data:`` URL (a page rendered without files beside it still links it)."""
    return "data:text/csv;charset=utf-8," + quote(text, safe=",.-_ :")


def top_note(section: QuestionSection) -> str:
    """What a large section shows, in words."""
    return (
        f"{section.question.k:,} categories: the {TOP} largest estimates are shown, largest "
        "first; the full table has every category"
    )
