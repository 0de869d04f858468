"""A survey's sampling design from its survey file: ``design = { table = "frame.csv" }``, a CSV
sampling frame with one row per public design key (docs/designs.md).

Columns ``key,stratum,psu,weight`` and optionally ``fpc`` (R-style: the number of PSUs in the
stratum's population, or the stratum's PSU sampling fraction; constant within a stratum) and
``post_stratum`` (a public post-stratum, e.g. an age band, with ``population = { band = count,
... }`` beside ``table``: the known population counts the estimates are post-stratified to), or
instead one column per raking variable named by ``margins = { variable = { category = count,
... }, ... }`` beside ``table`` (the known population margins the estimates are raked to). A key
is typically one stratum x PSU x weight class; every report carries its device's key and the
aggregator joins the frame to the per-key statistics at analysis time. The frame is validated on
load, each problem one line naming the file and row.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from client.survey import (
    MAX_DESIGN_KEYS,
    DesignKeys,
    QuestionSpec,
    SurveyError,
    design_key_digest,
    unknown_design_key,
)

#: The most per-key sums one question may need (keys x statistic size; 16 bytes each: 1 GiB),
#: so a large-domain question with a fine frame is refused on load, not by a full disk.
MAX_DESIGN_CELLS = 2**26
REQUIRED_COLUMNS = ("key", "stratum", "psu", "weight")
OPTIONAL_COLUMNS = ("fpc", "post_stratum")


@dataclass(frozen=True)
class FrameRow:
    """One design key's place in the design: its stratum, PSU (nested in the stratum), weight
    (inverse inclusion probability) and R-style fpc (None: with replacement)."""

    stratum: str
    psu: str
    weight: float
    fpc: float | None = None
    post_stratum: str = ""
    raking: tuple[str, ...] = ()  # the key's category of each raking variable, margins' order


@dataclass(frozen=True)
class SamplingFrame(DesignKeys):
    """The sampling frame of a survey, keyed by design key (the aggregator's side of
    :class:`~client.survey.DesignKeys`, whose digests it derives from its rows: what GetSurvey
    publishes so that devices check their key before charging)."""

    digests: frozenset[bytes] = field(init=False, default=frozenset())
    table: str = ""
    rows: dict[str, FrameRow] = field(default_factory=dict, compare=False)
    #: Known population count per post-stratum (empty: no post-stratification).
    population: dict[str, float] = field(default_factory=dict, compare=False)
    #: Known population count per category of each raking variable (empty: no raking).
    margins: dict[str, dict[str, float]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digests", frozenset(map(design_key_digest, self.rows)))

    def check_key(self, survey_id: str, key: str) -> str:
        """Membership of the rows themselves (a digest may collide, a row may not)."""
        super().check_key(survey_id, key)
        if key not in self.rows:
            raise SurveyError(unknown_design_key(survey_id, key))
        return key

    @property
    def strata(self) -> int:
        return len({row.stratum for row in self.rows.values()})

    @property
    def psus(self) -> int:
        return len({(row.stratum, row.psu) for row in self.rows.values()})


def read_design(value: object, folder: Path, survey_id: object) -> SamplingFrame | None:
    """The survey's frame from its ``design`` entry (None when absent); SurveyError naming the
    problem otherwise. ``table`` is relative to the survey file's ``folder``."""
    if value is None:
        return None
    where = f"survey {survey_id}: design"
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("table"), str)
        or set(value) - {"table", "population", "margins"}
    ):
        raise SurveyError(
            f'{where} must be {{ table = "frame.csv" }} (a CSV sampling frame), optionally '
            "with population = { post_stratum = count, ... } or margins = { variable = "
            "{ category = count, ... }, ... }"
        )
    if "population" in value and "margins" in value:
        raise SurveyError(f"{where}: give population (post-strata) or margins (raking), not both")
    path = folder / value["table"]
    population = _population(value.get("population", {}), where)
    margins = _margins(value.get("margins", {}), where)
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:  # a BOM is not a column
            rows = _rows(csv.reader(handle), f"{where} {path}", tuple(margins))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SurveyError(f"{where}: cannot read {path}: {exc}") from None
    _check_post_strata(rows, population, f"{where} {path}")
    _check_raking(rows, margins, f"{where} {path}")
    return SamplingFrame(table=str(path), rows=rows, population=population, margins=margins)


def check_design_size(
    frame: SamplingFrame | None, questions: Sequence[QuestionSpec], survey_id: object
) -> None:
    """SurveyError when a question's per-key sums would exceed MAX_DESIGN_CELLS."""
    if frame is None:
        return
    for question in questions:
        cells = len(frame.rows) * question.statistic_size
        if cells > MAX_DESIGN_CELLS:
            raise SurveyError(
                f"survey {survey_id}, question {question.id}: {len(frame.rows):,} design keys x "
                f"{question.statistic_size:,} categories need {cells:,} per-key sums, more than "
                f"{MAX_DESIGN_CELLS:,}: use a coarser frame (keys per stratum x PSU) for it"
            )


def _population(value: object, where: str) -> dict[str, float]:
    """Known population counts by post-stratum, each a finite positive number."""
    if not isinstance(value, dict):
        raise SurveyError(f"{where}: population must be a table {{ post_stratum = count, ... }}")
    out = {}
    for name, count in value.items():
        number = (
            float(count)
            if isinstance(count, int | float) and not isinstance(count, bool)
            else math.nan
        )
        if not math.isfinite(number) or number <= 0:
            raise SurveyError(f"{where}: population of {name!r} must be a finite positive count")
        out[str(name)] = number
    if len(out) == 1:
        raise SurveyError(f"{where}: population needs at least 2 post-strata")
    return out


def _margins(value: object, where: str) -> dict[str, dict[str, float]]:
    """Known population margins: per raking variable (a frame column) its categories' counts,
    at least 2 categories each, every count finite and positive, every margin of one total."""
    shape = "margins must be { variable = { category = count, ... }, ... }"
    if not isinstance(value, dict):
        raise SurveyError(f"{where}: {shape}")
    out: dict[str, dict[str, float]] = {}
    for name, counts in value.items():
        if name in REQUIRED_COLUMNS + OPTIONAL_COLUMNS:
            raise SurveyError(f"{where}: margin {name!r} names a frame column of its own")
        if not isinstance(counts, dict) or len(counts) < 2:
            raise SurveyError(f"{where}: margin {name!r} needs at least 2 categories ({shape})")
        out[str(name)] = _population(counts, f"{where}: margin {name!r}")
    totals = {name: sum(counts.values()) for name, counts in out.items()}
    first = next(iter(totals.values()), 0.0)
    for name, total in totals.items():
        if not math.isclose(total, first, rel_tol=1e-9):
            raise SurveyError(
                f"{where}: margin {name!r} sums to {total:g}, another to {first:g}; every "
                "margin counts the same population"
            )
    return out


def _check_raking(
    rows: dict[str, FrameRow], margins: dict[str, dict[str, float]], where: str
) -> None:
    """Every key's category of each raking variable is one of its margin's, and every margin
    category has a key."""
    for j, (name, counts) in enumerate(margins.items()):
        named = {row.raking[j] for row in rows.values()}
        unknown = sorted(named - set(counts))
        if unknown:
            raise SurveyError(
                f"{where}: {name} {unknown[0]!r} is not a category of margin {name!r} "
                f"({', '.join(counts)})"
            )
        missing = [category for category in counts if category not in named]
        if missing:
            raise SurveyError(f"{where}: no key lies in {name} {missing[0]!r} of its margin")


def _check_post_strata(rows: dict[str, FrameRow], population: dict[str, float], where: str) -> None:
    """Every key in a post-stratum of ``population`` and every post-stratum in the frame, or
    neither declared."""
    named = {row.post_stratum for row in rows.values()}
    if not population:
        if named != {""}:
            raise SurveyError(f"{where}: a post_stratum column needs population = {{ ... }}")
        return
    unknown = sorted(named - set(population))
    if unknown:
        raise SurveyError(
            f"{where}: post_stratum {unknown[0]!r} has no population count (every key needs a "
            "post-stratum of population)"
        )
    missing = sorted(set(population) - named)
    if missing:
        raise SurveyError(f"{where}: no key lies in post-stratum {missing[0]!r} of population")


def _rows(reader, where: str, raking: tuple[str, ...] = ()) -> dict[str, FrameRow]:
    """The frame's rows by key; ``raking`` names the raking variables' columns."""
    header = [name.strip() for name in next(reader, [])]
    missing = [name for name in (*REQUIRED_COLUMNS, *raking) if name not in header]
    if missing:
        raise SurveyError(f"{where}: missing column(s) {', '.join(missing)} (header {header})")
    unknown = set(header) - set(REQUIRED_COLUMNS) - set(OPTIONAL_COLUMNS) - set(raking)
    if unknown or len(set(header)) != len(header):
        raise SurveyError(f"{where}: unexpected or repeated column(s) in header {header}")
    index = {name: header.index(name) for name in header}
    rows: dict[str, FrameRow] = {}
    stratum_of: dict[str, str] = {}
    fpc_of: dict[str, float | None] = {}
    for line, cells in enumerate(reader, start=2):
        if not any(cell.strip() for cell in cells):
            continue
        at = f"{where} line {line}"
        if len(cells) != len(header):
            raise SurveyError(f"{at}: {len(cells)} fields, the header has {len(header)}")
        key, stratum, psu = (cells[index[name]].strip() for name in ("key", "stratum", "psu"))
        try:
            DesignKeys().check_key("", key)
        except SurveyError:
            raise SurveyError(f"{at}: a key must be 1-64 printable characters") from None
        if not stratum or not psu:
            raise SurveyError(f"{at}: stratum and psu must not be empty")
        if key in rows:
            raise SurveyError(f"{at}: key {key!r} appears twice")
        if len(rows) == MAX_DESIGN_KEYS:
            raise SurveyError(f"{where}: more than {MAX_DESIGN_KEYS} keys")
        weight = _number(cells[index["weight"]], "weight", at)
        fpc = _number(cells[index["fpc"]], "fpc", at) if "fpc" in index else None
        if stratum_of.setdefault(psu, stratum) != stratum:
            raise SurveyError(
                f"{at}: psu {psu!r} lies in strata {stratum_of[psu]!r} and {stratum!r}; a PSU "
                "is nested in one stratum (give PSUs of different strata different labels)"
            )
        if fpc_of.setdefault(stratum, fpc) != fpc:
            raise SurveyError(f"{at}: fpc differs within stratum {stratum!r}")
        post_stratum = cells[index["post_stratum"]].strip() if "post_stratum" in index else ""
        categories = tuple(cells[index[name]].strip() for name in raking)
        rows[key] = FrameRow(stratum, psu, weight, fpc, post_stratum, categories)
    if not rows:
        raise SurveyError(f"{where}: lists no keys")
    return rows


def _number(text: str, name: str, at: str) -> float:
    """A finite positive number, else SurveyError."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SurveyError(f"{at}: {name} must be a finite positive number, got {text.strip()!r}")
    return value


#: The label of an answer that analyses a survey with a sampling design as a simple random
#: sample because the user opted out (--ignore-design, design = false, design=False): CLI, JSON,
#: reports and RPC trailers.
IGNORES_DESIGN = (
    "ignores the sampling design: analysed as a simple random sample of independent reports "
    "(weights, strata and clusters unused; docs/designs.md)"
)


def design_refusal(survey_id: str) -> str:
    """Why a survey with a sampling design is not monitored: the sequences and e-processes treat
    reports as a simple random sample of independent devices, which weights and clusters are not
    (unweighted they are biased, clustered they are too narrow)."""
    return (
        f"survey {survey_id} declares a sampling design: anytime-valid monitoring assumes a "
        "simple random sample of independent devices; use estimate/test (design-based) at fixed n "
        "(docs/monitoring.md, Limits)"
    )
