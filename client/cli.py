"""``ldp-client``: submit an answer, flush the outbox, show the budget, simulate a population,
show the device key to enroll.

``--tls-ca`` connects over TLS (the server is checked against that CA) and ``--tls-cert``/
``--tls-key`` add the device certificate for mTLS; plaintext only with an explicit ``--insecure``.

User mistakes end with a one-line message on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from client.device.keys import DeviceKey, device_key_path
from client.device.ledger import Budget, Ledger, LedgerError
from client.device.reporter import Reporter
from client.device.tls import TlsSettings
from client.device.transport import Transport, TransportError
from client.survey import SurveyError, SurveySpec
from protos.ldp.v1 import ldp_pb2

PROG = "ldp-client"


class UserError(Exception):
    """A mistake in the command line or its inputs."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (
        UserError,
        LedgerError,
        SurveyError,
        TransportError,
        KeyError,
        ValueError,
        OSError,
    ) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="LDP survey device client")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    submit = sub.add_parser("submit", help="randomize one answer, queue it and upload")
    _server(submit)
    _state(submit)
    submit.add_argument("--survey", required=True)
    submit.add_argument("--question", required=True)
    submit.add_argument("--answer", required=True, help="category label or index ('a|b' joint)")
    submit.add_argument("--budget", type=float, help="enroll with this epsilon budget")
    submit.add_argument("--delta", type=float, default=1e-6)
    submit.add_argument("--pointwise", type=float, help="pure-epsilon share of the budget")
    submit.add_argument("--no-flush", action="store_true", help="only queue, do not upload")
    submit.add_argument(
        "--memoize",
        action="store_true",
        help="replay the stored report when the same answer is given again (saves budget; the "
        "server then sees whether the answer changed)",
    )
    submit.add_argument("--json", action="store_true")
    submit.set_defaults(run=run_submit)

    flush = sub.add_parser("flush", help="upload everything pending in the outbox")
    _server(flush)
    _state(flush)
    flush.add_argument("--json", action="store_true")
    flush.set_defaults(run=run_flush)

    budget = sub.add_parser("budget", help="show the privacy budget and what is spent")
    _state(budget)
    budget.add_argument("--json", action="store_true")
    budget.set_defaults(run=run_budget)

    key = sub.add_parser("device-key", help="show (and create) the device's signing key")
    _state(key)
    key.add_argument("--out", type=Path, help="write the public key PEM here, not to stdout")
    key.add_argument("--json", action="store_true")
    key.set_defaults(run=run_device_key)

    sim = sub.add_parser("simulate", help="play a population of devices against a server")
    _server(sim)
    sim.add_argument("--survey", required=True)
    sim.add_argument("--devices", type=int, required=True)
    sim.add_argument(
        "--truth",
        action="append",
        default=[],
        metavar="QUESTION=P1,P2,...",
        help="true answer distribution of a question (default uniform); repeatable",
    )
    sim.add_argument("--batch", type=int, default=1000, help="reports per upload")
    sim.add_argument("--seed", type=int, help="seed for drawing the true answers")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(run=run_simulate)
    return parser


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
    tls = TlsSettings(args.tls_ca, args.tls_cert, args.tls_key)
    return Transport(args.server, tls=tls, timeout=args.timeout)


def _state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", type=Path, required=True, help="device state file (SQLite)")


def _reporter(args: argparse.Namespace) -> Reporter:
    budget = None
    if getattr(args, "budget", None) is not None:
        budget = Budget(args.budget, args.delta, args.pointwise)
    elif not args.state.exists():
        raise UserError(f"{args.state} does not exist: enroll first with submit --budget EPS")
    memoize = getattr(args, "memoize", False)
    return Reporter(_transport(args), args.state, budget, memoize=memoize)


def run_submit(args: argparse.Namespace) -> int:
    reporter = _reporter(args)
    try:
        answer: object = int(args.answer) if args.answer.isdigit() else args.answer
        report_id = reporter.answer(args.survey, args.question, answer)
        result = None if args.no_flush else reporter.flush()
    finally:
        reporter.close()
    out = {"report_id": report_id.hex(), "flush": None if result is None else vars(result)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"queued report {report_id.hex()}")
        if result is not None:
            _print_flush(result)
    return 0 if result is None or not result.error else 1


def run_flush(args: argparse.Namespace) -> int:
    reporter = _reporter(args)
    try:
        result = reporter.flush()
    finally:
        reporter.close()
    if args.json:
        print(json.dumps(vars(result)))
    else:
        _print_flush(result)
    return 0 if not result.error else 1


def _print_flush(result) -> None:
    print(
        f"accepted {result.accepted}, duplicate {result.duplicate}, rejected {result.rejected}, "
        f"still pending {result.pending}"
    )
    if result.error:
        print(f"upload stopped: {result.error}", file=sys.stderr)
    if result.retry_after is not None:
        print(f"the server asks to flush again in {result.retry_after:g} s", file=sys.stderr)


def run_budget(args: argparse.Namespace) -> int:
    if not args.state.exists():
        raise UserError(f"{args.state} does not exist")
    ledger = Ledger(args.state)
    try:
        spent_pure, spent_zcdp = ledger.spent()
        left_pure, left_zcdp = ledger.remaining()
        info = {
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
        }
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key:>20}: {value}")
    return 0


def run_device_key(args: argparse.Namespace) -> int:
    key = DeviceKey.load_or_create(device_key_path(args.state))
    pem = key.public_key_pem().decode()
    if args.out:
        args.out.write_text(pem)
    if args.json:
        print(json.dumps({"device_id": key.device_id, "public_key_pem": pem}))
    else:
        print(f"device id: {key.device_id}")
        if not args.out:
            print(pem, end="")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    if args.devices < 1 or args.batch < 1:
        raise UserError("--devices and --batch must be positive")
    with _transport(args) as transport:
        survey = transport.get_survey(args.survey)
        if survey.require_device_auth:
            raise UserError(
                f"survey {survey.id} requires signed uploads; simulated devices have no keys"
            )
        truths = _truths(survey, args.truth)
        rng = np.random.default_rng(args.seed)
        answers = {
            q.id: rng.choice(q.k, size=args.devices, p=truths[q.id]) for q in survey.questions
        }
        total = args.devices * len(survey.questions)
        progress = Progress(total, enabled=sys.stderr.isatty() and not args.json)
        counts = {"accepted": 0, "duplicate": 0}
        batch: list[ldp_pb2.Report] = []
        started = time.perf_counter()
        for device in range(args.devices):
            for question in survey.questions:
                mech = question.mechanism
                value = int(answers[question.id][device])
                batch.append(
                    ldp_pb2.Report(
                        report_id=os.urandom(16),
                        survey_id=survey.id,
                        question_id=question.id,
                        payload=mech.encode(mech.randomize(value)),
                    )
                )
            if len(batch) >= args.batch or device == args.devices - 1:
                for result in transport.upload(batch):
                    counts["accepted" if result.status == ldp_pb2.ACCEPTED else "duplicate"] += 1
                progress.advance(len(batch))
                batch = []
        progress.finish()
    elapsed = time.perf_counter() - started
    cost = _device_cost(survey)
    summary = {"devices": args.devices, "reports": total, "seconds": elapsed, **counts, **cost}
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{args.devices} devices sent {total} reports in {elapsed:.1f} s: "
            f"{counts['accepted']} accepted, {counts['duplicate']} duplicate; "
            f"each device spent epsilon {cost['epsilon']:g} (pure) and rho {cost['rho']:g} (zCDP)"
        )
    return 0


def _truths(survey: SurveySpec, specs: list[str]) -> dict[str, np.ndarray]:
    truths = {q.id: np.full(q.k, 1.0 / q.k) for q in survey.questions}
    for spec in specs:
        name, _, values = spec.partition("=")
        if name not in truths:
            raise UserError(f"--truth names unknown question {name!r}")
        try:
            p = np.array([float(v) for v in values.split(",")])
        except ValueError:
            raise UserError(f"--truth {spec!r}: probabilities must be numbers") from None
        if p.size != truths[name].size or (p < 0).any() or not np.isclose(p.sum(), 1.0):
            raise UserError(
                f"--truth {name}: need {truths[name].size} non-negative probabilities summing to 1"
            )
        truths[name] = p / p.sum()
    return truths


def _device_cost(survey: SurveySpec) -> dict[str, float]:
    costs = [q.mechanism.cost for q in survey.questions]
    return {
        "epsilon": sum(c.value for c in costs if c.kind == "pure"),
        "rho": sum(c.value for c in costs if c.kind == "zcdp"),
    }


class Progress:
    """A one-line progress bar on stderr, shown only on a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.started = time.perf_counter()

    def advance(self, count: int) -> None:
        self.done += count
        if self.enabled:
            fraction = self.done / self.total
            rate = self.done / max(time.perf_counter() - self.started, 1e-9)
            bar = "#" * int(30 * fraction)
            print(
                f"\r[{bar:<30}] {self.done}/{self.total} ({rate:,.0f}/s)", end="", file=sys.stderr
            )

    def finish(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
