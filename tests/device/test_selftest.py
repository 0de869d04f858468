"""Catching a mis-encoding device (docs/wire.md §9, docs/threat-model.md "A mis-encoding device
population"): the device's own self-check replays the conformance vectors, and the aggregator
refuses what cannot be a valid report, sees some systematic errors in aggregate, and cannot see a
relabelling of categories."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aggregator.histogram import Histogram
from aggregator.stats import estimate
from aggregator.store import checks, ingest
from client.cli import main as cli
from client.device import selftest
from client.mechanisms import HadamardResponse, OptimizedUnaryEncoding
from client.survey import Attribute, SurveySpec, build_question
from protos.ldp.v1 import ldp_pb2


def _reverse_bits_in_each_byte(payload: bytes) -> bytes:
    """The classic mistake: most significant bit first inside each byte (§3.3 says least)."""
    return bytes(int(f"{byte:08b}"[::-1], 2) for byte in payload)


def test_the_shipped_vectors_are_reproduced_here():
    result = selftest.run()
    assert result.ok, result.failures
    assert result.version == 3
    assert result.checked == {
        "reports": 71,
        "digests": 13,
        "signatures": 2,
        "splits": 7,
        "design_keys": 5,
    }


def test_a_wrong_bit_order_is_caught_by_the_self_check(monkeypatch):
    """OUE at k = 64 with the bits of each byte reversed: valid bytes, so the aggregator accepts
    them (below); the self-check names every OUE vector it breaks and nothing else."""
    right = OptimizedUnaryEncoding.randomize_payload  # the path a device's answer takes
    monkeypatch.setattr(
        OptimizedUnaryEncoding,
        "randomize_payload",
        lambda self, value, source: _reverse_bits_in_each_byte(right(self, value, source)),
    )
    result = selftest.run()
    assert not result.ok
    assert all("optimized_unary" in failure for failure in result.failures)
    oue = [v for v in json.loads(selftest.VECTORS_PATH.read_text())["reports"]]
    oue = [v for v in oue if v["mechanism"] == "optimized_unary"]
    changed = [
        v
        for v in oue
        if bytes.fromhex(v["payload_hex"])
        != _reverse_bits_in_each_byte(bytes.fromhex(v["payload_hex"]))
    ]
    assert len(result.failures) == len(changed) > 0


def test_the_command_line(tmp_path, capsys):
    assert cli.main(["selftest"]) == 0
    assert "all reproduced" in capsys.readouterr().out
    document = json.loads(selftest.VECTORS_PATH.read_text())
    document["reports"][3]["payload_hex"] = "ff" * (len(document["reports"][3]["payload_hex"]) // 2)
    document["digests"][0]["digest_hex"] = "00" * 32
    tampered = tmp_path / "vectors.json"
    tampered.write_text(json.dumps(document))
    assert cli.main(["selftest", "--vectors", str(tampered)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("reports[3]: ") and out[1].startswith("digests[0]: ")
    assert out[-1].endswith("2 differ")
    assert cli.main(["selftest", "--vectors", str(tmp_path / "absent.json"), "--json"]) == 2
    assert json.loads(capsys.readouterr().err)["status"] == 2


def _question(mechanism: str, k: int, epsilon: float) -> tuple[SurveySpec, object]:
    attribute = Attribute("q", tuple(f"c{j}" for j in range(k)))
    question = build_question("q", "", [attribute], mechanism, epsilon)
    return SurveySpec("s", "", (question,), 1), question


def _validate(survey: SurveySpec, payloads: list[bytes]) -> list[bool]:
    """Per payload: accepted by the aggregator's validation (True) or refused."""
    accepted = []
    for i, payload in enumerate(payloads):
        report = ldp_pb2.Report(
            report_id=i.to_bytes(16, "big"), survey_id="s", question_id="q", payload=payload
        )
        try:
            ingest.validate(report, {"s": survey})
            accepted.append(True)
        except checks.ReportRejectedError as exc:
            assert exc.reason == checks.Rejection.MALFORMED  # INVALID_ARGUMENT on the wire
            accepted.append(False)
    return accepted


def test_wrong_bit_order_at_k_64_is_accepted_and_is_a_relabelling():
    """Undetectable at the aggregator: every byte pattern is a valid OUE report when k is a
    multiple of 8, and reversing the bits only permutes the categories, which leaves every
    statistic that does not know the true distribution unchanged (the sum of the estimates
    here)."""
    survey, question = _question("optimized_unary", 64, 1.0)
    mech = question.mechanism
    rng = np.random.default_rng(5)
    values = rng.choice(64, size=3000, p=np.r_[0.5, np.full(63, 0.5 / 63)])
    reports = mech.simulate(values, rng)
    wrong = [_reverse_bits_in_each_byte(mech.encode(r)) for r in reports]
    assert all(_validate(survey, wrong[:300]))
    decoded = np.array([mech.decode(p) for p in wrong])
    right_est = estimate(Histogram.from_reports(mech, reports)).frequencies
    wrong_est = estimate(Histogram.from_reports(mech, decoded)).frequencies
    assert wrong_est.sum() == pytest.approx(right_est.sum())  # nothing to see in aggregate
    assert right_est[0] > 0.4 and wrong_est[7] > 0.4 and abs(wrong_est[0]) < 0.1  # relabelled


def test_wrong_bit_order_at_k_6_sets_padding_bits_and_is_refused():
    """Detectable: with k = 6 the reversed bits 0 and 1 land on the padding bits 7 and 6, so
    exactly the reports with bit 0 or 1 set are refused (INVALID_ARGUMENT), about half of a
    population's reports: a device sending them sees its uploads refused at once."""
    survey, question = _question("optimized_unary", 6, 1.0)
    mech = question.mechanism
    rng = np.random.default_rng(6)
    reports = mech.simulate(rng.integers(6, size=400), rng)
    accepted = _validate(survey, [_reverse_bits_in_each_byte(mech.encode(r)) for r in reports])
    expected = ~(reports[:, 0].astype(bool) | reports[:, 1].astype(bool))
    assert accepted == expected.tolist()
    assert 0.3 < 1 - np.mean(accepted) < 0.9


def test_a_flipped_hadamard_sign_shows_in_the_sum_of_the_estimates():
    """Valid columns, so accepted one by one; but reporting the other half of the columns turns
    the unbiased estimates' sum from 1 into -1, far outside its error: a check an analyst can run
    on any support-count question (threat-model.md)."""
    survey, question = _question("hadamard_response", 6, 2.0)
    mech = question.mechanism
    assert isinstance(mech, HadamardResponse)
    rng = np.random.default_rng(7)
    values = rng.integers(6, size=20_000)
    columns = mech.simulate(values, rng)
    rows = values + 1
    flipped = columns ^ (rows & -rows)  # the other half: H[x + 1, c] = -1 where +1 was meant
    assert all(_validate(survey, [mech.encode(int(c)) for c in flipped[:300]]))
    right = estimate(Histogram.from_reports(mech, columns)).frequencies.sum()
    wrong = estimate(Histogram.from_reports(mech, flipped)).frequencies.sum()
    assert abs(right - 1) < 0.1 and abs(wrong + 1) < 0.1
