"""Survey definitions survive the wire: what a device rebuilds from GetSurvey (and what a shard
manifest stores as JSON) is the exact question the aggregator validates against. A mismatch
means devices randomize with other parameters than the server checks (found by fuzzing: a
``granularity_bits = 0`` question came back with the default grid of 2**-10)."""

from __future__ import annotations

import pytest
from fuzz_support import FUZZ_SETTINGS, FUZZ_SURVEYS
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from client.survey import Attribute, QuestionSpec, SurveySpec, build_question
from protos.ldp.v1 import ldp_pb2

parameters = st.floats(1e-6, 1e3, allow_subnormal=False)


@st.composite
def questions(draw) -> QuestionSpec:
    mechanism = draw(
        st.sampled_from(["randomized_response", "flip_components", "gaussian", "laplace"])
    )
    sizes = draw(st.lists(st.integers(2, 5), min_size=1, max_size=2))
    attributes = [
        Attribute(f"a{i}", tuple(f"c{j}" for j in range(size))) for i, size in enumerate(sizes)
    ]
    return build_question(
        draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)),
        draw(st.text(max_size=20)),
        attributes,
        mechanism,
        draw(parameters),
        draw(st.integers(0, 20)),
    )


@pytest.mark.slow
@FUZZ_SETTINGS
@given(questions())
def test_question_round_trips_through_proto_and_json(question: QuestionSpec) -> None:
    assert QuestionSpec.from_proto(question.to_proto()) == question
    wire = ldp_pb2.Question.FromString(question.to_proto().SerializeToString())
    assert QuestionSpec.from_proto(wire) == question
    as_json = json_format.MessageToDict(question.to_proto())
    assert QuestionSpec.from_proto(json_format.ParseDict(as_json, ldp_pb2.Question())) == question


def test_fuzz_surveys_round_trip() -> None:
    for survey in FUZZ_SURVEYS.values():
        assert SurveySpec.from_proto(survey.to_proto()) == survey
