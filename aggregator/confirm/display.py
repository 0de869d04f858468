"""How confirmatory results and holdout answers print (the CLI; the RPCs send the record)."""

from __future__ import annotations

from aggregator.confirm.sparse_validate import SparseValidate
from aggregator.survey_file.design import IGNORES_DESIGN


def sealed_text(record: dict, already: bool) -> str:
    """The sealed record as a table, with the plan's hash and when it was sealed."""
    state = "sealed earlier, unchanged" if already else "sealed now"
    lines = [
        f"confirmatory results of survey {record['survey']} ({state} at {record['sealed_at']})",
        f"plan sha256 {record['plan_sha256']}",
        f"{record['multiplicity']} over {len(record['results'])} test(s) at family-wise alpha "
        f"{record['alpha']:g}, on the confirmation side only",
    ]
    width = max(5, *(len(r["title"]) for r in record["results"]))
    lines.append(f"  {'test':<{width}}  {'n':>7}  {'statistic':>10}  {'p':>9}  {'adjusted':>9}")
    for r in record["results"]:
        decision = "reject H0" if r["reject"] else "do not reject H0"
        lines.append(
            f"  {r['title']:<{width}}  {r['n']:>7}  {r['statistic']:>10.4f}  {r['pvalue']:>9.3g}"
            f"  {r['adjusted']:>9.3g}  {decision}"
        )
    designs = {r["design"] for r in record["results"] if r.get("design")}
    for design in sorted(designs):
        titles = ", ".join(r["title"] for r in record["results"] if r.get("design") == design)
        said = design if design == IGNORES_DESIGN else f"design-based: {design}"
        lines.append(f"  {titles}: {said}")
    return "\n".join(lines)


def holdout_text(state: dict, reject: bool, level: float, question_id: str, test: str) -> str:
    """One holdout answer: the bit, the level it was run at, and the guarantee."""
    validate = SparseValidate(**state)
    decision = "reject H0" if reject else "do not reject H0"
    lines = [
        f"holdout query {state['answered']} ({test} on {question_id}): {decision} "
        f"at level {level:.3g}",
        validate.guarantee(),
    ]
    if validate.closed:
        lines.append(validate.closed_reason())
    return "\n".join(lines)
