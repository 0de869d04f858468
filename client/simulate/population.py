"""``ldp-client simulate``: play a population of devices against a server (a load generator for
demos, studies and benchmarks; no device runs it).

Each simulated device draws its true answers from the given distributions (``--truth``, also
from a file: client/simulate/truths.py), randomizes them with the question's mechanism (the same
code a device runs) and uploads in batches. With ``--keys DIR`` (client/simulate/keys.py) each
device signs its own upload with its enrolled key, as surveys with ``require_device_auth``
demand. A survey with a sampling design gives each device a key of its frame
(``--design-keys``, client/simulate/frame.py) and, with ``--icc RHO``, answers clustered by PSU
(client/simulate/clusters.py). Kept out of client/cli/main.py so that a device's commands never
load it (docs/architecture.md, "Packaging by role").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from client.budgeting import survey_cost
from client.cli.progress import bar
from client.device.split import split_side
from client.simulate.clusters import draw_answers
from client.simulate.frame import FrameError, SimulationFrame, read_frame
from client.simulate.truths import TruthError, read_truths
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

if TYPE_CHECKING:
    from client.device.keys import DeviceKey
    from client.device.transport import Transport


SIGNED_IN_FLIGHT = 8  # signed uploads (one simulated device each) sent at once


class SimulationError(ValueError):
    """A mistake in the simulate command's flags (ldp-client prints it as one line, exit 2)."""


def run_simulate(args: argparse.Namespace, connect: Callable[[], Transport]) -> int:
    """Run the command; ``connect`` opens the transport the command line's flags describe."""
    if args.devices < 1 or args.batch < 1:
        raise SimulationError("--devices and --batch must be positive")
    if not 0 <= args.icc < 1:  # also NaN
        raise SimulationError(
            f"--icc {args.icc:g}: the intra-cluster correlation must be in [0, 1)"
        )
    keys = _keys(args)
    with connect() as transport:
        survey = transport.get_survey(args.survey)
        if survey.require_device_auth and keys is None:
            raise SimulationError(
                f"survey {survey.id} requires signed uploads: give the simulated devices "
                "enrolled keys with --keys DIR (see ldp-client simulate-keys)"
            )
        try:
            truths = read_truths(survey, args.truth)
        except TruthError as exc:
            raise SimulationError(str(exc)) from None
        drawn = _draw(args, survey, truths)
        values, groups, answers = drawn.values, drawn.groups, drawn.answers
        total = args.devices * len(survey.questions)
        batch: list[ldp_pb2.Report] = []
        started = time.perf_counter()
        in_flight = 1 if keys is None else SIGNED_IN_FLIGHT
        with (
            bar(total, "simulate", unit="reports", quiet=args.json) as progress,
            _Uploads(transport, progress, in_flight) as uploads,
        ):
            for device in range(args.devices):
                # A split survey: each simulated device has its own split secret (wire.md §3.10).
                side = split_side(os.urandom(32), survey.id, survey.exploration_fraction)
                for question in survey.questions:
                    mech = question.mechanism
                    answer = int(answers[question.id][device])
                    batch.append(
                        ldp_pb2.Report(
                            report_id=os.urandom(16),
                            survey_id=survey.id,
                            question_id=question.id,
                            payload=mech.encode(mech.randomize(answer)),
                            definition_digest=question.digest,
                            side=side,
                            group=values[groups[device]],
                            design_key=drawn.keys[device],
                        )
                    )
                # A signed upload carries one device's reports; unsigned ones fill --batch.
                signer = None if keys is None else keys[device]
                if signer is not None or len(batch) >= args.batch or device == args.devices - 1:
                    uploads.send(batch, signer)
                    batch = []
        counts = uploads.counts
    elapsed = time.perf_counter() - started
    cost = survey_cost(survey.questions)
    devices_per_group = (
        {v: int((groups == g).sum()) for g, v in enumerate(values)} if any(values) else None
    )
    summary = {
        "devices": args.devices,
        "reports": total,
        **({"groups": devices_per_group} if devices_per_group is not None else {}),
        **({"icc": drawn.icc, "psus": drawn.psus} if drawn.icc else {}),
        "seconds": elapsed,
        **counts,
        "epsilon": cost.epsilon,
        "rho": cost.rho,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{args.devices} devices sent {total} reports in {elapsed:.1f} s: "
            f"{counts['accepted']} accepted, {counts['duplicate']} duplicate; "
            f"each device spent epsilon {cost.epsilon:g} (pure) and rho {cost.rho:g} (zCDP), "
            f"covered by {cost.flags}"
        )
        if devices_per_group is not None and survey.group_label is not None:
            counted = ", ".join(f"{v} {n:,}" for v, n in devices_per_group.items())
            print(f"devices per {survey.group_label.name}: {counted}")
        if drawn.icc:
            print(
                f"true answers clustered in {drawn.psus} PSUs with intra-cluster correlation "
                f"{drawn.icc:g}"
            )
    return 0


@dataclass(frozen=True)
class _Drawn:
    """What the simulated devices are: the group values, each device's group index, design key
    ('' without a design) and true answer per question; the ICC and the PSUs with devices."""

    values: list[str]
    groups: np.ndarray
    keys: list[str]
    answers: dict[str, np.ndarray]
    icc: float
    psus: int


def _draw(args: argparse.Namespace, survey: SurveySpec, truths: dict[str, np.ndarray]) -> _Drawn:
    """Groups, then design keys (of the device's group where the frame implies groups), then
    answers (clustered by PSU with --icc), all from one generator seeded by --seed."""
    frame = _frame(survey, args.design_keys)
    icc = _icc(survey, frame, args.icc)
    values, shares = _group_shares(survey, args.group_share)
    by_group = _group_truths(survey, values, truths, args.truth_for)
    rng = np.random.default_rng(args.seed)
    groups = rng.choice(len(values), size=args.devices, p=shares)
    # Only a survey with a design draws keys: the draws of every other survey's answers
    # stay those of the same --seed before design keys existed.
    try:
        keys = [""] * args.devices if frame is None else frame.draw(rng, groups, values)
    except FrameError as exc:
        raise SimulationError(str(exc)) from None
    clusters = None if icc == 0 or frame is None else np.array(frame.psu_index(keys))
    truth_of = [by_group[value] for value in values]
    answers = draw_answers(rng, survey.questions, truth_of, groups, clusters, icc)
    psus = 0 if clusters is None else int(np.unique(clusters).size)
    return _Drawn(values, groups, keys, answers, icc, psus)


class _Uploads:
    """Sends the batches and counts the answers. Signed batches (one device each) keep up to
    ``in_flight`` uploads going at once, so one server commit serves several devices."""

    def __init__(self, transport: Transport, progress: Any, in_flight: int) -> None:
        self._transport = transport
        self._progress = progress
        self._in_flight = in_flight
        self._pool = ThreadPoolExecutor(in_flight) if in_flight > 1 else None
        self._pending: deque[tuple[Future, int]] = deque()
        self.counts = {"accepted": 0, "duplicate": 0}

    def send(self, batch: list[ldp_pb2.Report], signer: DeviceKey | None) -> None:
        if self._pool is None:
            self._count(self._transport.upload(batch, signer), len(batch))
            return
        self._pending.append((self._pool.submit(self._transport.upload, batch, signer), len(batch)))
        while len(self._pending) >= 2 * self._in_flight:
            self._settle()

    def _settle(self) -> None:
        future, size = self._pending.popleft()
        self._count(future.result(), size)

    def _count(self, results: list[ldp_pb2.ReportResult], size: int) -> None:
        for result in results:
            self.counts["accepted" if result.status == ldp_pb2.ACCEPTED else "duplicate"] += 1
        self._progress.update(size)

    def __enter__(self) -> _Uploads:
        return self

    def __exit__(self, error: object, *rest: object) -> None:
        """Wait for the uploads still going (after a failure: cancel those not started)."""
        if self._pool is None:
            return
        try:
            while self._pending and error is None:
                self._settle()
        finally:
            self._pool.shutdown(cancel_futures=True)


def _frame(survey: SurveySpec, path: Path | None) -> SimulationFrame | None:
    """The frame simulated devices take their design keys from: None for a survey without a
    design, else the frame at ``path`` (client/simulate/frame.py)."""
    if survey.design is None:
        if path is not None:
            raise SimulationError(
                f"survey {survey.id} has no sampling design; --design-keys is for one"
            )
        return None
    if path is None:
        raise SimulationError(
            f"survey {survey.id} has a sampling design: give the simulated devices keys with "
            "--design-keys FRAME.csv"
        )
    try:
        return read_frame(path, survey.group_label)
    except FrameError as exc:
        raise SimulationError(str(exc)) from None


def _icc(survey: SurveySpec, frame: SimulationFrame | None, icc: float) -> float:
    """``--icc`` (in [0, 1), checked before connecting) checked against the survey: rho > 0
    only with a frame that names PSUs."""
    if icc > 0 and frame is None:
        raise SimulationError(
            f"--icc clusters answers by PSU: survey {survey.id} has no sampling design"
        )
    if icc > 0 and frame is not None and frame.psus is None:
        raise SimulationError(
            "--icc clusters answers by PSU: the --design-keys file has no psu column (give "
            "the survey's frame, key,stratum,psu,weight)"
        )
    return icc


def _group_shares(survey: SurveySpec, spec: str | None) -> tuple[list[str], np.ndarray]:
    """The groups simulated devices fall into and their shares: [''] for a survey without a
    group label; equal shares over its values unless ``--group-share`` gives them."""
    label = survey.group_label
    if label is None:
        if spec:
            raise SimulationError(
                f"survey {survey.id} has no group label; --group-share is for one"
            )
        return [""], np.ones(1)
    if not spec:
        return list(label.values), np.full(len(label.values), 1.0 / len(label.values))
    shares = {}
    for part in spec.split(","):
        name, _, share = part.partition("=")
        if name not in label.values:
            raise SimulationError(
                f"--group-share: {name!r} is not one of the {label.name} values of survey "
                f"{survey.id} ({', '.join(label.values)})"
            )
        try:
            shares[name] = float(share)
        except ValueError:
            raise SimulationError(f"--group-share {part!r}: expected GROUP=SHARE") from None
    p = np.array(list(shares.values()))
    if (p < 0).any() or not np.isclose(p.sum(), 1.0):
        raise SimulationError("--group-share: shares must be non-negative and sum to 1")
    return list(shares), p / p.sum()


def _group_truths(
    survey: SurveySpec, values: list[str], truths: dict[str, np.ndarray], specs: list[str]
) -> dict[str, dict[str, np.ndarray]]:
    """Per simulated group its true answer distributions: ``truths`` with ``--truth-for
    GROUP:QUESTION=P1,...`` applied to that group."""
    out = {value: dict(truths) for value in values}
    for spec in specs:
        value, sep, rest = spec.partition(":")
        if not sep or value not in out or not value:
            raise SimulationError(
                f"--truth-for {spec!r}: expected GROUP:QUESTION=P1,... with GROUP one of the "
                f"simulated groups ({', '.join(v for v in values if v) or 'none'})"
            )
        if rest.startswith("@"):
            raise SimulationError(f"--truth-for {spec!r}: give QUESTION=P1,... (files: --truth)")
        question = rest.partition("=")[0]
        try:
            out[value][question] = read_truths(survey, [rest])[question]
        except TruthError as exc:
            raise SimulationError(f"--truth-for {spec!r}: {exc}") from None
    return out


def _keys(args: argparse.Namespace) -> list[DeviceKey] | None:
    """The simulated devices' signing keys from --keys, or None to upload unsigned."""
    if args.keys is None:
        return None
    from client.simulate.keys import KeyFolderError, load_keys  # lazily: cryptography

    try:
        return load_keys(args.keys, args.devices)
    except KeyFolderError as exc:
        raise SimulationError(str(exc)) from None


def run_simulate_keys(args: argparse.Namespace) -> int:
    """``ldp-client simulate-keys``: write the key folder ``simulate --keys`` reads."""
    from client.simulate.keys import KeyFolderError, make_keys  # lazily: cryptography

    try:
        new = make_keys(args.out, args.devices)
    except KeyFolderError as exc:
        raise SimulationError(str(exc)) from None
    print(
        f"{new} new simulated device keys ({args.devices} in all) in {args.out}; enroll them: "
        f"ldp-aggregator enroll --devices REGISTRY --public-key {args.out}"
    )
    return 0
