"""The true answer distributions of ``ldp-client simulate``: ``--truth QUESTION=P1,P2,...`` on the
command line, or ``--truth @FILE`` for questions with many categories.

FILE is either a JSON object (its first non-blank character is ``{``) mapping a question id to
its probabilities, as a list in category order or as an object from category label to
probability (every label once), or text with one ``QUESTION=P1,P2,...`` per line (blank lines
and lines starting with ``#`` skipped). Every distribution is checked against its question.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from client.survey import QuestionSpec, SurveySpec


class TruthError(ValueError):
    """A --truth that does not describe distributions over the survey's questions."""


def read_truths(survey: SurveySpec, specs: Sequence[str]) -> dict[str, np.ndarray]:
    """Per question its true distribution: uniform unless a ``--truth`` (or a line or key of a
    ``--truth @FILE``) gives it."""
    truths = {q.id: np.full(q.k, 1.0 / q.k) for q in survey.questions}
    questions = {q.id: q for q in survey.questions}
    for where, name, value in _entries(specs):
        question = questions.get(name)
        if question is None:
            raise TruthError(f"{where} names unknown question {name!r}")
        truths[name] = _distribution(where, question, value)
    return truths


def _entries(specs: Sequence[str]) -> Iterator[tuple[str, str, object]]:
    """(where, question id, probabilities as given) of each --truth value, files read."""
    for spec in specs:
        if spec.startswith("@"):
            yield from _file_entries(Path(spec[1:]))
        else:
            name, _, values = spec.partition("=")
            yield f"--truth {name}", name, values


def _file_entries(path: Path) -> Iterator[tuple[str, str, object]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TruthError(f"--truth @{path}: cannot read it: {why}") from None
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TruthError(
                f"--truth @{path}: not valid JSON (line {exc.lineno}: {exc.msg})"
            ) from None
        if not isinstance(document, dict):
            raise TruthError(f"--truth @{path}: expected a JSON object of question ids")
        for name, value in document.items():
            yield f"--truth @{path} ({name})", name, value
        return
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, values = line.partition("=")
        if not sep:
            raise TruthError(f"--truth @{path} line {number}: expected QUESTION=P1,P2,...")
        yield f"--truth @{path} line {number}", name.strip(), values


def _distribution(where: str, question: QuestionSpec, value: object) -> np.ndarray:
    """``value`` (comma-separated text, a list, or a label mapping) as a checked distribution."""
    if isinstance(value, dict):
        unknown = [label for label in value if label not in question.labels]
        missing = [label for label in question.labels if label not in value]
        if unknown or missing:
            first = unknown[:1] or missing[:1]
            what = "unknown label" if unknown else "no probability for label"
            raise TruthError(f"{where}: {what} {first[0]!r} (question {question.id})")
        value = [value[label] for label in question.labels]
    try:
        if isinstance(value, str):
            p = np.array([float(v) for v in value.split(",")])
        elif isinstance(value, list) and not any(isinstance(v, bool | str) for v in value):
            p = np.array(value, dtype=float)
        else:
            raise ValueError
    except (TypeError, ValueError):
        raise TruthError(f"{where}: probabilities must be numbers") from None
    if p.shape != (question.k,) or not np.isfinite(p).all() or (p < 0).any():
        raise TruthError(
            f"{where}: need {question.k} non-negative probabilities summing to 1, got {p.size}"
        )
    if not np.isclose(p.sum(), 1.0):
        raise TruthError(f"{where}: the probabilities sum to {p.sum():.6g}, not 1")
    return p / p.sum()
