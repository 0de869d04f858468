"""``ldp-client``: submit an answer, flush the outbox, show the budget, install a survey
definition for offline use, simulate a population, show the device key to enroll.

``submit`` works offline: with the aggregator unreachable it randomizes with the survey
definition cached on the device (fetched earlier, or installed with ``install-survey``), queues
the report, says so and exits 0; ``flush`` uploads it later.

``--tls-ca`` connects over TLS (the server is checked against that CA) and ``--tls-cert``/
``--tls-key`` add the device certificate for mTLS; plaintext only with an explicit ``--insecure``.

User mistakes end with a one-line message on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import os
import sys

# gRPC's C core reads GRPC_VERBOSITY once, when grpc is first imported: its own log lines stay
# off a CLI user's terminal (our errors say it in one line) unless asked for (--grpc-log, or
# GRPC_VERBOSITY set in the environment).
if "--grpc-log" not in sys.argv:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from client import __version__
from client.budgeting import DEFAULT_DELTA, survey_cost
from client.cli.parsing import DefaultsFormatter, OneLineParser, reader_went_away
from client.device.filekind import create_private
from client.device.household import Household, HouseholdTerms, create_terms
from client.device.ledger import Budget, BudgetExceeded, Ledger, LedgerError
from client.device.reporter import Reporter
from client.device.survey_cache import SurveyCache
from client.device.transport import Transport, TransportError
from client.survey import SurveyError, survey_from_json

PROG = "ldp-client"


class UserError(Exception):
    """A mistake in the command line or its inputs."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:
        return reader_went_away()
    except (
        UserError,
        LedgerError,
        SurveyError,
        TransportError,
        KeyError,
        ValueError,
        OSError,
    ) as exc:
        message = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
        if getattr(args, "json", False):
            print(_dumps({"error": message, "status": 2}), file=sys.stderr)
        else:
            print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, description="LDP survey device client", formatter_class=DefaultsFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--grpc-log", action="store_true", help="let gRPC's own log lines through to stderr"
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    submit = _command(sub, "submit", "randomize one answer, queue it and upload")
    _server(submit)
    _state(submit)
    submit.add_argument("--survey", required=True, help="survey id")
    submit.add_argument("--question", required=True, help="question id")
    given = submit.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--answer",
        help='the answer\'s category label, always read as a label ("2" is the category '
        "named 2); 'a|b' for a question with two attributes",
    )
    given.add_argument(
        "--index", type=int, help="the answer's category index instead (0-based, row-major)"
    )
    submit.add_argument(
        "--budget",
        type=float,
        help="enroll this device with this epsilon budget (first use); "
        "`ldp-aggregator cost` prints the flags a survey needs",
    )
    submit.add_argument(
        "--delta", type=float, default=DEFAULT_DELTA, help="delta of the (epsilon, delta) budget"
    )
    submit.add_argument(
        "--pointwise",
        type=float,
        help="pure-epsilon share of the budget (default: all of it, which leaves nothing for "
        "Gaussian questions)",
    )
    submit.add_argument(
        "--best-of",
        action="store_true",
        help="enroll a pure-only device under the best-of rule: admit while the epsilon sum "
        "fits --budget or the sum of epsilon^2/2 fits its zCDP conversion at --delta (more "
        "answers at small epsilon; (budget, delta)-DP once the sum exceeds the budget)",
    )
    submit.add_argument(
        "--group",
        metavar="VALUE",
        help="surveys with a group label: this device's group (an arm, region, wave), sent "
        "unrandomized with every report and fixed after the first one",
    )
    submit.add_argument(
        "--design-key",
        metavar="KEY",
        help="surveys with a sampling design: this device's design key (its row of the "
        "sampling frame, from the study), sent unrandomized with every report and fixed after "
        "the first one",
    )
    submit.add_argument("--no-flush", action="store_true", help="only queue, do not upload")
    submit.add_argument(
        "--memoize",
        action="store_true",
        help="a question answered before: resend this device's first report instead of refusing "
        "(no new cost, counted once; the first answer stands, even if this one differs)",
    )
    _json(submit)
    submit.set_defaults(run=run_submit)

    flush = _command(sub, "flush", "upload everything pending in the outbox")
    _server(flush)
    _state(flush)
    _json(flush)
    flush.set_defaults(run=run_flush)

    budget = _command(sub, "budget", "show the privacy budget and what is spent (read only)")
    _state(budget)
    _json(budget)
    budget.set_defaults(run=run_budget)

    household = _command(
        sub, "household", "enrol this device in a household (for household_shared questions)"
    )
    actions = household.add_subparsers(required=True, metavar="ACTION")
    create = _command(
        actions, "create", "create a household: a fresh secret and its cap; prints the code"
    )
    _state(create)
    create.add_argument(
        "--cap",
        type=float,
        required=True,
        help="household cap: epsilon all its devices may spend on household_shared questions "
        "together (the group bound, docs/households.md)",
    )
    create.add_argument(
        "--rho-cap", type=float, default=0.0, help="household cap for Gaussian shared questions"
    )
    create.add_argument(
        "--devices",
        type=int,
        default=1,
        help="devices that will join (each charges devices x cost per shared question)",
    )
    create.add_argument(
        "--code-out",
        type=Path,
        help="write the enrolment code to this file (created 0600) instead of stdout",
    )
    _json(create)
    create.set_defaults(run=run_household_create)
    join = _command(
        actions,
        "join",
        "join a household with its enrolment code, read from --code-file or standard input",
    )
    _state(join)
    join.add_argument(
        "--code-file", type=Path, help="file holding the code (default: read standard input)"
    )
    _json(join)
    join.set_defaults(run=run_household_join)

    install = _command(
        sub,
        "install-survey",
        "install a survey definition file (ldp-aggregator export-survey) for offline answers",
    )
    install.add_argument("file", type=Path, help="survey definition file (JSON)")
    _state(install)
    _json(install)
    install.set_defaults(run=run_install_survey)

    cached = _command(sub, "surveys", "list the survey definitions cached on the device")
    _state(cached)
    _json(cached)
    cached.set_defaults(run=run_surveys)

    key = _command(sub, "device-key", "show (and create) the device's signing key")
    _state(key)
    key.add_argument("--out", type=Path, help="write the public key PEM here, not to stdout")
    _json(key)
    key.set_defaults(run=run_device_key)

    selftest = _command(
        sub,
        "selftest",
        "replay the wire conformance vectors on this device (samplers, encodings, digests, "
        "signatures): exit 0 when all match",
    )
    selftest.add_argument(
        "--vectors", type=Path, help="vectors file (default: the one shipped with this package)"
    )
    _json(selftest)
    selftest.set_defaults(run=run_selftest)

    sim = _command(sub, "simulate", "play a population of devices against a server")
    _server(sim)
    sim.add_argument("--survey", required=True, help="survey id")
    sim.add_argument("--devices", type=int, required=True, help="number of simulated devices")
    sim.add_argument(
        "--truth",
        action="append",
        default=[],
        metavar="QUESTION=P1,P2,... | @FILE",
        help="true answer distribution of a question (default uniform); repeatable. @FILE: a "
        "JSON object {question: [P1, ...] or {label: P}} or one QUESTION=P1,... per line",
    )
    sim.add_argument(
        "--group-share",
        metavar="GROUP=SHARE,...",
        help="surveys with a group label: the share of devices in each group, e.g. "
        "control=0.5,treatment=0.5 (default: equal shares)",
    )
    sim.add_argument(
        "--truth-for",
        action="append",
        default=[],
        metavar="GROUP:QUESTION=P1,P2,...",
        help="true answer distribution of a question in one group (default: --truth); repeatable",
    )
    sim.add_argument(
        "--design-keys",
        type=Path,
        metavar="FRAME.csv",
        help="surveys with a sampling design: the frame (a CSV with a 'key' column, or one key "
        "per line); each simulated device gets one of its keys at random, of its own group "
        "where the frame implies groups (a column named after the group label, or strata "
        "named by group values)",
    )
    sim.add_argument(
        "--icc",
        type=float,
        default=0.0,
        metavar="RHO",
        help="intra-cluster correlation of the true answers, 0 <= RHO < 1: each PSU of the "
        "--design-keys frame (its psu column) draws its own answer distribution around the "
        "truth (a Dirichlet of concentration (1-RHO)/RHO), so a PSU of m devices has design "
        'effect 1 + (m-1) RHO before local noise (docs/designs.md, "Simulating a design")',
    )
    sim.add_argument("--batch", type=int, default=1000, help="reports per upload (unsigned)")
    sim.add_argument(
        "--keys",
        type=Path,
        metavar="DIR",
        help="enrolled keys of the simulated devices (simulate-keys): each device signs its "
        "own upload",
    )
    sim.add_argument("--seed", type=int, help="seed for drawing the true answers")
    _json(sim)
    sim.set_defaults(run=run_simulate)

    sim_keys = _command(sub, "simulate-keys", "write signing keys for simulated devices")
    sim_keys.add_argument("--out", type=Path, required=True, help="key folder (created 0700)")
    sim_keys.add_argument("--devices", type=int, required=True, help="number of devices")
    sim_keys.set_defaults(run=run_simulate_keys)
    return parser


def _command(sub, name: str, text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=text, description=text, formatter_class=DefaultsFormatter)


def _dumps(value: object) -> str:
    """JSON text of ``value``: json loads only for --json output, off one answer's path."""
    import json

    return json.dumps(value)


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="machine-readable output (errors too, on stderr)"
    )


def _server(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, help="aggregator address host:port")
    parser.add_argument("--timeout", type=float, default=10.0, help="deadline per call (s)")
    parser.add_argument("--tls-ca", type=Path, help="CA certificate (PEM): connect over TLS")
    parser.add_argument("--tls-cert", type=Path, help="device certificate (PEM) for mTLS")
    parser.add_argument("--tls-key", type=Path, help="device private key (PEM) for mTLS")
    parser.add_argument(
        "--insecure", action="store_true", help="plaintext, no TLS (development and loopback only)"
    )


def _transport(args: argparse.Namespace) -> Transport:
    """TLS (or mTLS) from the flags; plaintext only when asked for with --insecure."""
    _check_target(args.server)
    if args.insecure:
        if args.tls_ca or args.tls_cert or args.tls_key:
            raise UserError("--insecure cannot be combined with --tls-ca/--tls-cert/--tls-key")
        return Transport(args.server, timeout=args.timeout)
    if args.tls_ca is None:
        if args.tls_cert or args.tls_key:
            raise UserError("--tls-cert and --tls-key need --tls-ca")
        raise UserError(
            "no transport security configured: pass --tls-ca (and --tls-cert/--tls-key for "
            "mTLS), or --insecure for plaintext"
        )
    from client.device.tls import TlsSettings  # lazily: cryptography only for TLS

    tls = TlsSettings(args.tls_ca, args.tls_cert, args.tls_key)
    return Transport(args.server, tls=tls, timeout=args.timeout)


def _check_target(target: str) -> None:
    """host:port with a port in 1..65535 (gRPC would otherwise wrap it around or hang)."""
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(f"--server {target!r}: expected HOST:PORT with a port from 1 to 65535")


def _state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state", type=Path, required=True, help="device state file (SQLite, created 0600)"
    )


def _reporter(args: argparse.Namespace) -> Reporter:
    _check_target(args.server)
    budget = None
    if getattr(args, "budget", None) is not None:
        budget = Budget(args.budget, args.delta, args.pointwise, getattr(args, "best_of", False))
    elif not args.state.exists():
        raise UserError(f"{args.state} does not exist: enroll first with submit --budget EPS")
    memoize = getattr(args, "memoize", False)
    return Reporter(_transport(args), args.state, budget, memoize=memoize)


def run_selftest(args: argparse.Namespace) -> int:
    """``ldp-client selftest``: a mis-encoding device is otherwise accepted and only biases the
    estimates (docs/wire.md §9)."""
    from client.device import selftest

    try:
        result = selftest.run(args.vectors)
    except (OSError, ValueError, KeyError) as exc:
        path = args.vectors or selftest.VECTORS_PATH
        raise UserError(f"cannot read the vectors {path}: {exc}") from None
    if args.json:
        print(_dumps({"ok": result.ok, **vars(result)}))
    else:
        for failure in result.failures:
            print(failure)
        counts = ", ".join(f"{n} {kind}" for kind, n in result.checked.items())
        verdict = "all reproduced" if result.ok else f"{len(result.failures)} differ"
        print(f"conformance vectors version {result.version}: {counts}: {verdict}")
    return 0 if result.ok else 1


def run_submit(args: argparse.Namespace) -> int:
    reporter = _reporter(args)
    try:
        try:
            if args.index is not None:
                report_id = reporter.answer_index(
                    args.survey, args.question, args.index, args.group, design_key=args.design_key
                )
            else:
                report_id = reporter.answer(
                    args.survey, args.question, args.answer, args.group, design_key=args.design_key
                )
        except BudgetExceeded as exc:
            survey = reporter.survey(args.survey)
            cost = survey_cost(survey.questions, reporter.ledger.budget.delta)
            raise UserError(
                f"{exc}. Survey {survey.id} costs a device epsilon {cost.epsilon:g} (pure) and "
                f"rho {cost.rho:g} (zCDP); a device enrolled with {cost.flags} can answer all "
                "of it once (ldp-aggregator cost)"
            ) from None
        offline = reporter.offline
        result = None if args.no_flush or offline else reporter.flush()
    finally:
        reporter.close()
    unreachable = result is not None and bool(result.error) and _unreachable(result.error)
    out: dict[str, object] = {
        "report_id": report_id.hex(),
        "queued": True,
        "offline": bool(offline) or unreachable,
        "flush": None if result is None else vars(result),
    }
    if args.json:
        print(_dumps(out))
    else:
        print(f"queued report {report_id.hex()}")
        if offline:
            print(
                f"the aggregator is unreachable ({offline}): answered with the cached survey "
                "definition; run ldp-client flush when online"
            )
        elif result is not None:
            _print_flush(result)
            if unreachable:
                print("the report stays queued; run ldp-client flush when online")
    if result is not None and result.refusals:
        return _refused(result.refusals)
    return 0 if result is None or not result.error or unreachable else 1


def _refused(refusals: tuple[str, ...]) -> int:
    """Exit 1 with one line on stderr when reports were refused for good: they can never count
    (the device keeps them in its dead-letter table; a wrong design key, group or answer)."""
    more = f" (and {len(refusals) - 1} other reason(s))" if len(refusals) > 1 else ""
    print(f"{PROG}: error: refused for good: {refusals[0]}{more}", file=sys.stderr)
    return 1


def _unreachable(error: str) -> bool:
    """Whether a flush stopped because the aggregator could not be reached (not a refusal)."""
    return error.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED"))


def run_flush(args: argparse.Namespace) -> int:
    reporter = _reporter(args)
    try:
        result = reporter.flush()
    finally:
        reporter.close()
    if args.json:
        print(_dumps(vars(result)))
    else:
        _print_flush(result)
    if result.refusals:
        return _refused(result.refusals)
    return 0 if not result.error else 1


def _print_flush(result) -> None:
    print(
        f"accepted {result.accepted}, duplicate {result.duplicate}, rejected {result.rejected}, "
        f"still pending {result.pending}"
    )
    for refusal in result.refusals:
        print(f"refused for good (kept in the device's dead-letter table): {refusal}")
    if result.error:
        print(f"upload stopped: {result.error}", file=sys.stderr)
    if result.retry_after is not None:
        print(f"the server asks to flush again in {result.retry_after:g} s", file=sys.stderr)


def run_budget(args: argparse.Namespace) -> int:
    if not args.state.exists():
        raise UserError(f"{args.state} does not exist")
    ledger = Ledger.read_only(args.state)
    try:
        spent_pure, spent_zcdp = ledger.spent()
        left_pure, left_zcdp = ledger.remaining()
        loss = ledger.odometer()
        info: dict[str, object] = {
            "epsilon_budget": ledger.budget.epsilon,
            "delta": ledger.budget.delta,
            "pointwise_cap": ledger.budget.pointwise,
            "rho_cap": ledger.budget.rho_cap,
            "spent_pointwise": spent_pure,
            "spent_rho": spent_zcdp,
            "remaining_pointwise": left_pure,
            "remaining_rho": left_zcdp,
            "charges": len(ledger.charges()),
            "guarantee": ledger.guarantee(),
            "policy": ledger.budget.policy,
            "odometer_epsilon": loss.epsilon,
            "odometer_delta": loss.delta,
            "odometer_form": loss.form,
        }
        if ledger.budget.best_of:
            best_spent = ledger.best_of_spent()
            info["best_of_rho_cap"] = ledger.budget.best_of_rho_cap
            info["best_of_rho_spent"] = best_spent
            info["best_of_rho_remaining"] = max(0.0, ledger.budget.best_of_rho_cap - best_spent)
        with Household.read_only(args.state) as household:
            info["household"] = None if household is None else household.status()
    finally:
        ledger.close()
    if args.json:
        print(_dumps(info))
    else:
        for key, value in info.items():
            if key != "household":
                print(f"{key:>21}: {value}")
        chance = f"with probability 1 - {loss.delta:g}" if loss.delta else "with certainty"
        print(
            f"{'loss so far':>21}: epsilon <= {loss.epsilon:.6g} {chance} "
            "(odometer, spec B.4; the filter above is what enforces)"
        )
        _print_household(info["household"])
    return 0


def run_household_create(args: argparse.Namespace) -> int:
    if args.code_out is not None and args.code_out.exists():
        raise UserError(f"{args.code_out} exists; the code is written to a new file only")
    terms = create_terms(args.cap, args.rho_cap, args.devices)
    with Household.enrol(args.state, terms, "created") as household:
        status = household.status()
    code = terms.code()
    if args.code_out is not None:
        create_private(args.code_out)
        args.code_out.write_text(code + "\n")
    shown = None if args.code_out is not None else code
    if args.json:
        print(_dumps({"household": status, "code": shown, "code_file": _str(args.code_out)}))
        return 0
    print(
        f"created a household in {args.state}: cap epsilon {terms.epsilon_cap:g}, rho "
        f"{terms.rho_cap:g}, for {terms.devices} device(s)"
    )
    if shown is None:
        print(f"enrolment code written to {args.code_out} (keep it secret; delete it once used)")
    else:
        print(f"enrolment code (keep it secret; ldp-client household join reads it):\n{code}")
    return 0


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def run_household_join(args: argparse.Namespace) -> int:
    if args.code_file is not None:
        try:
            code = args.code_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {args.code_file}: {exc}") from None
    else:
        if sys.stdin.isatty():
            print("paste the household code, then press Enter:", file=sys.stderr)
        code = sys.stdin.readline()
    terms = HouseholdTerms.from_code(code)
    with Household.enrol(args.state, terms, "joined") as household:
        status = household.status()
    if args.json:
        print(_dumps({"household": status}))
    else:
        print(
            f"{args.state} joined the household: cap epsilon {terms.epsilon_cap:g}, rho "
            f"{terms.rho_cap:g}, {terms.devices} device(s)"
        )
    return 0


def _print_household(status: object) -> None:
    """The household part of ``ldp-client budget``."""
    if not isinstance(status, dict):
        print(f"{'household':>21}: none")
        return
    print(
        f"{'household':>21}: {status['source']}, {status['devices']} device(s); shared questions "
        f"answered {status['shared_answers']}, group cost {status['spent_epsilon']:.6g} of "
        f"epsilon cap {status['epsilon_cap']:.6g}, {status['spent_rho']:.6g} of rho cap "
        f"{status['rho_cap']:.6g}"
    )


def run_install_survey(args: argparse.Namespace) -> int:
    try:
        text = args.file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read survey file {args.file}: {exc}") from None
    try:
        survey = survey_from_json(text)
    except SurveyError as exc:
        raise UserError(f"{args.file}: {exc}") from None
    with SurveyCache(args.state) as cache:
        changed = cache.put(survey, str(args.file))
    state = "installed" if changed else "already installed"
    digests = {q.id: q.digest.hex() for q in survey.questions}
    if args.json:
        print(_dumps({"survey": survey.id, "installed": changed, "digests": digests}))
    else:
        print(f"{state} survey {survey.id} ({len(survey.questions)} questions) in {args.state}")
    return 0


class _CachedSurveyRow(TypedDict):
    """One survey definition in `ldp-client surveys` (a JSON object with --json)."""

    survey: str
    source: str
    stored_at: float
    questions: dict[str, str]  # question id -> definition digest (hex)


def run_surveys(args: argparse.Namespace) -> int:
    if not args.state.exists():
        raise UserError(f"{args.state} does not exist")
    with SurveyCache.read_only(args.state) as cache:
        cached = cache.surveys()
    rows = [
        _CachedSurveyRow(
            survey=c.survey.id,
            source=c.source,
            stored_at=c.stored_at,
            questions={q.id: q.digest.hex() for q in c.survey.questions},
        )
        for c in cached
    ]
    if args.json:
        print(_dumps(rows))
    elif not rows:
        print(f"no survey definitions cached in {args.state}")
    for row in [] if args.json else rows:
        stored = time.strftime("%Y-%m-%d %H:%M", time.gmtime(row["stored_at"]))
        print(
            f"{row['survey']}: {len(row['questions'])} question(s), "
            f"from {row['source']}, {stored} UTC"
        )
    return 0


def run_device_key(args: argparse.Namespace) -> int:
    from client.device.keys import DeviceKey, device_key_path  # lazily: cryptography

    key = DeviceKey.load_or_create(device_key_path(args.state))
    pem = key.public_key_pem().decode()
    if args.out:
        args.out.write_text(pem)
    if args.json:
        print(_dumps({"device_id": key.device_id, "public_key_pem": pem}))
    else:
        print(f"device id: {key.device_id}")
        if not args.out:
            print(pem, end="")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    """``ldp-client simulate``: a population load generator no device runs, so its code lives in
    client/simulate/population.py and loads only for this command (docs/architecture.md)."""
    from client.simulate.population import run_simulate as simulate

    return simulate(args, lambda: _transport(args))


def run_simulate_keys(args: argparse.Namespace) -> int:
    """``ldp-client simulate-keys``: keys for ``simulate --keys`` (client/simulate/keys.py)."""
    from client.simulate.population import run_simulate_keys as make

    return make(args)


if __name__ == "__main__":
    sys.exit(main())
