"""``check-config``, ``cost``, ``export-survey``: what a survey file defines, what answering a
survey costs one device, and a survey's definition file for ``ldp-client install-survey``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from aggregator.cli.common import Subcommands, UserError, add_command, add_json_option, find_survey
from aggregator.store.sqlite.reader import StoreReader
from aggregator.survey_file.analyses import load_analyses
from aggregator.survey_file.config import load_limits, load_surveys
from aggregator.survey_file.design import SamplingFrame
from client.budgeting import DEFAULT_DELTA, survey_cost
from client.survey import REFUSE, SurveySpec, survey_to_json


def add_commands(subparsers: Subcommands) -> None:
    check = add_command(
        subparsers, "check-config", "validate a survey file and show what it defines"
    )
    check.add_argument("config", type=Path, help="survey definitions (TOML, docs/config.md)")
    check.add_argument(
        "--db", type=Path, help="also check it against the definitions pinned in this store"
    )
    add_json_option(check)
    check.set_defaults(run=run_check_config)

    cost = add_command(
        subparsers, "cost", "what one device spends on a survey, and the budget flags"
    )
    cost.add_argument("--config", type=Path, required=True, help="survey definitions (TOML)")
    cost.add_argument("--survey", help="one survey (default: every survey in the file)")
    cost.add_argument(
        "--delta", type=float, default=DEFAULT_DELTA, help="delta of the device budget"
    )
    add_json_option(cost)
    cost.set_defaults(run=run_cost)

    export_survey = add_command(
        subparsers, "export-survey", "write a survey definition file for ldp-client install-survey"
    )
    export_survey.add_argument(
        "--config", type=Path, required=True, help="survey definitions (TOML)"
    )
    export_survey.add_argument("--survey", required=True, help="survey id")
    export_survey.add_argument("--out", type=Path, help="output file (default: stdout)")
    export_survey.set_defaults(run=run_export_survey)


def _design(survey: SurveySpec) -> dict[str, Any] | None:
    """The survey's sampling frame in brief (None without a design)."""
    frame = survey.design
    if not isinstance(frame, SamplingFrame):
        return None
    return {
        "table": frame.table,
        "keys": len(frame.rows),
        "strata": frame.strata,
        "psus": frame.psus,
    }


def run_check_config(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    limits = load_limits(args.config)
    load_analyses(args.config, surveys)  # the optional analysis section is checked too
    if args.db is not None:
        with StoreReader(args.db) as reader:
            reader.check_definitions(surveys, args.config)
    rows: list[dict[str, Any]] = []  # JSON rows
    for survey in surveys.values():
        cost = survey_cost(survey.questions)
        rows.append(
            {
                "survey": survey.id,
                "min_batch_size": survey.min_batch_size,
                "require_device_auth": survey.require_device_auth,
                "household_members": survey.household_members,
                "exploration_fraction": survey.exploration_fraction,
                "group_label": None
                if survey.group_label is None
                else {"name": survey.group_label.name, "values": list(survey.group_label.values)},
                "design": _design(survey),
                "limits": survey.id in limits and limits[survey.id].declared,
                "cost": cost.to_dict(),
                "questions": [
                    {
                        "id": q.id,
                        "k": q.k,
                        "digest": q.digest.hex(),
                        "repeat": q.repeat,
                        **q.definition(),
                    }
                    for q in survey.questions
                ],
            }
        )
    if args.json:
        print(json.dumps({"config": str(args.config), "ok": True, "surveys": rows}))
        return 0
    print(f"{args.config}: OK, {len(rows)} survey(s)")
    for row in rows:
        print(
            f"survey {row['survey']}: {len(row['questions'])} question(s), results released from "
            f"{row['min_batch_size']} reports; a device spends epsilon {row['cost']['epsilon']:g}"
            f" and rho {row['cost']['rho']:g} ({row['cost']['flags']})"
        )
        if row["exploration_fraction"]:
            print(
                f"  split: {100 * row['exploration_fraction']:g}% of devices explore, the rest "
                "confirm (docs/adaptive-analysis.md)"
            )
        if row["group_label"]:
            label = row["group_label"]
            print(
                f"  public group label {label['name']}: {', '.join(label['values'])} (sent "
                "unrandomized with every report; docs/two-sample.md)"
            )
        if row["design"]:
            design = row["design"]
            print(
                f"  sampling design {design['table']}: {design['keys']} keys, {design['strata']} "
                f"strata, {design['psus']} PSUs (every report carries its design key; "
                "docs/designs.md)"
            )
        for q in row["questions"]:
            parameter = f"rho = {q['rho']:g}" if "rho" in q else f"epsilon = {q['epsilon']:g}"
            shared = ", household_shared" if q.get("household_shared") else ""
            repeat = f", repeat = {q['repeat']}" if q["repeat"] != REFUSE else ""
            print(f"  {q['id']}: {q['mechanism']}, {parameter}, k = {q['k']}{shared}{repeat}")
    if args.db is not None:
        print(f"matches the definitions pinned in {args.db}")
    return 0


def run_cost(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if args.survey is None:
        chosen = list(surveys.values())
    else:
        chosen = [find_survey(surveys, args.survey, args.config)]
    try:
        costs = {s.id: survey_cost(s.questions, args.delta) for s in chosen}
    except ValueError as exc:
        raise UserError(f"--delta: {exc}") from None
    if args.json:
        print(json.dumps({survey_id: c.to_dict() for survey_id, c in costs.items()}))
        return 0
    for survey in chosen:
        cost = costs[survey.id]
        print(f"survey {survey.id}: one device answering each question once spends")
        for question in survey.questions:
            c = question.mechanism.cost
            name = "epsilon" if c.kind == "pure" else "rho"
            print(
                f"  {question.id:<24} {name} {c.value:g} ({'pure' if c.kind == 'pure' else 'zCDP'})"
            )
        print(
            f"  total: epsilon {cost.epsilon:g} (pure, pointwise bucket), rho {cost.rho:g} (zCDP)"
        )
        if cost.rho:
            print(
                f"  covered by an ({cost.budget:g}, {cost.delta:g})-DP budget with "
                f"{cost.pointwise:g} of it pointwise"
            )
        else:
            print(f"  covered by a pure {cost.budget:g}-LDP budget")
        print(f"  ldp-client submit ... {cost.flags}")
        if cost.household_epsilon or cost.household_rho:
            print(
                f"  household_shared questions: epsilon {cost.household_epsilon:g}, rho "
                f"{cost.household_rho:g} per household device; a household of D devices needs "
                f"ldp-client household create --cap D x {cost.household_epsilon:g}"
                + (f" --rho-cap D x {cost.household_rho:g}" if cost.household_rho else "")
                + " --devices D (docs/households.md)"
            )
    return 0


def run_export_survey(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    text = survey_to_json(find_survey(surveys, args.survey, args.config))
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"wrote survey {args.survey} to {args.out} (ldp-client install-survey {args.out})")
    return 0
