"""Anytime-valid monitoring over a running server's Monitor RPC as the same plain values a store's
release history gives (aggregator/analysis/monitor_answers.py): the MonitorResponse read back
field by field, so ``watch --server`` and the report's "as of n" section over ``--server``
render exactly what they render over ``--db``."""

from __future__ import annotations

from aggregator.analysis.monitor_answers import (
    Look,
    MonitorAnswer,
    MonitorLook,
    MonitorTest,
    Waiting,
    Watched,
    one_line,
)
from aggregator.remote.analyst import RemoteAnalyst
from aggregator.remote.errors import NotReleasedError
from protos.ldp.v1 import ldp_pb2


def answer_of(response: ldp_pb2.MonitorResponse) -> MonitorAnswer:
    """The plain answer a MonitorResponse carries."""
    test = None
    if response.HasField("evalue"):
        test = MonitorTest(
            response.evalue,
            response.max_evalue,
            response.pvalue,
            response.test_guarantee,
            response.method,
            response.rejected_at if response.HasField("rejected_at") else None,
        )
    looks = tuple(
        MonitorLook(
            look.n,
            look.log_evalue if look.HasField("log_evalue") else None,
            tuple(look.estimate),
            tuple(look.low),
            tuple(look.high),
        )
        for look in response.looks
    )
    return MonitorAnswer(
        n=response.n,
        labels=tuple(response.labels),
        estimate=tuple(response.estimate),
        low=tuple(response.low),
        high=tuple(response.high),
        interval_guarantee=response.interval_guarantee,
        decision=response.decision,
        alpha=response.alpha,
        max_n=response.max_n,
        test=test,
        looks=looks,
    )


def server_look(
    analyst: RemoteAnalyst, survey_id: str, side: str | None, group: str | None
) -> Look:
    """Each analysis's answer from the server's Monitor RPC (which releases what is due first)
    on ``side``; ``group`` is the one group read (None: all pooled) unless the analysis
    compares two."""

    def look(w: Watched, with_path: bool = False) -> MonitorAnswer | Waiting:
        try:
            response = analyst.monitor(
                survey_id,
                w.question,
                w.analysis,
                p0=w.p0,
                alpha=w.alpha,
                max_n=w.max_n,
                side=side,
                group=None if w.groups else group,
                groups=w.groups,
                with_path=with_path,
                scores=w.scores,
            )
        except NotReleasedError as exc:
            return Waiting(one_line(str(exc)))
        return answer_of(response)

    return look
