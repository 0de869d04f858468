"""Survey and question definitions, shared by devices (from the wire) and the aggregator (from
TOML). A question's mechanism is built from its declared parameters, so a device's privacy cost
always comes from the numbers it will actually randomize with."""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from client.mechanisms import (
    DEFAULT_GRANULARITY_BITS,
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
)
from protos.ldp.v1 import ldp_pb2

MECHANISM_NAMES = {
    "randomized_response": ldp_pb2.RANDOMIZED_RESPONSE,
    "flip_components": ldp_pb2.FLIP_COMPONENTS,
    "gaussian": ldp_pb2.GAUSSIAN,
    "laplace": ldp_pb2.LAPLACE,
    "optimized_unary": ldp_pb2.OPTIMIZED_UNARY,
    "hadamard_response": ldp_pb2.HADAMARD_RESPONSE,
    "subset_selection": ldp_pb2.SUBSET_SELECTION,
    "local_hashing": ldp_pb2.LOCAL_HASHING,
    "public_coin_bit": ldp_pb2.PUBLIC_COIN_BIT,
}
#: The epsilon-LDP mechanisms built from (k, epsilon) alone.
_EPSILON_ONLY: dict[str, Callable[[int, float], Mechanism]] = {
    "randomized_response": RandomizedResponse,
    "flip_components": FlipComponents,
    "optimized_unary": OptimizedUnaryEncoding,
    "hadamard_response": HadamardResponse,
    "subset_selection": SubsetSelection,
    "local_hashing": LocalHashing,
}
DIGEST_FORMAT = "ldp-question-definition/1"
#: What a device does when asked a question it answered before (docs/config.md, "Repeat
#: answers"): refuse it (the default), or resend its first report unchanged (memoize). Either
#: way a device is counted once per question.
REFUSE, MEMOIZE = "refuse", "memoize"
REPEAT_POLICIES = (REFUSE, MEMOIZE)
_REPEAT_ENUM = {REFUSE: ldp_pb2.REPEAT_REFUSE, MEMOIZE: ldp_pb2.REPEAT_MEMOIZE}  # on the wire
_NO_REPLACE = (
    "repeat = 'replace' is not supported: the aggregator could un-count the first report only "
    "by linking it to the device's second one, and nothing at rest may tie reports to a device; "
    "use 'refuse' (the default) or 'memoize', and a separate question per wave of a panel "
    '(docs/config.md, "Repeat answers")'
)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SurveyError(ValueError):
    """A survey or question definition is invalid."""


@dataclass(frozen=True)
class Attribute:
    name: str
    categories: tuple[str, ...]


@dataclass(frozen=True)
class QuestionSpec:
    """One question: its attributes (one, or several for a contingency table) and mechanism.

    ``household_shared``: the answer belongs to the household (its members share it), so one
    respondent per household answers, charged to the household ledger (docs/households.md).
    ``repeat``: what a device does with a second answer, REFUSE or MEMOIZE (not part of the
    definition digest: it changes no report, only whether a device sends a second one).
    """

    id: str
    text: str
    attributes: tuple[Attribute, ...]
    mechanism: Mechanism
    household_shared: bool = False
    repeat: str = REFUSE

    @property
    def k(self) -> int:
        return self.mechanism.k

    @property
    def statistic_size(self) -> int:
        """Length of the question's stored sufficient statistic (k, or 2L public groups)."""
        return self.mechanism.statistic_size

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(a.categories) for a in self.attributes)

    @property
    def table_shape(self) -> tuple[int, int] | None:
        """(rows, columns) of the contingency table of a question of two attributes (what an
        independence test needs); None for any other question."""
        if len(self.attributes) != 2:
            return None
        rows, columns = self.attributes
        return len(rows.categories), len(columns.categories)

    @property
    def labels(self) -> list[str]:
        """Category labels in joint (row-major) order, attributes joined by '|'."""
        labels = [""]
        for attribute in self.attributes:
            labels = [f"{p}|{c}" if p else c for p in labels for c in attribute.categories]
        return labels

    def index(self, answer: str | Sequence[str]) -> int:
        """The joint category index of an answer given by its label: a category label, or for
        several attributes the labels joined by '|' or one label per attribute. A label is
        always a label ("2" is the category named "2"); a position goes through
        :meth:`check_index`."""
        if isinstance(answer, str):
            parts = answer.split("|") if len(self.attributes) > 1 else [answer]
        elif isinstance(answer, Sequence) and all(isinstance(p, str) for p in answer):
            parts = list(answer)
        else:
            raise SurveyError(
                f"question {self.id}: an answer is a category label, got {answer!r} (give a "
                "category index explicitly: Reporter.answer_index, ldp-client submit --index)"
            )
        if len(parts) != len(self.attributes):
            raise SurveyError(
                f"question {self.id} needs one label per attribute "
                f"({', '.join(a.name for a in self.attributes)}), joined by '|'"
            )
        index = 0
        for part, attribute in zip(parts, self.attributes, strict=True):
            index = index * len(attribute.categories) + _category(part, attribute)
        return index

    def check_index(self, index: object) -> int:
        """A joint category index (0 .. k-1, row-major for several attributes), checked."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.k:
            raise SurveyError(
                f"question {self.id}: category index must be an integer from 0 to {self.k - 1}, "
                f"got {index!r} (labels in index order: {_listing(self.labels)})"
            )
        return index

    def definition(self) -> dict[str, object]:
        """Everything that decides how a report is randomized and read: mechanism, parameter,
        grid, attributes and their categories, the household tag when set (not the text)."""
        mech = self.mechanism
        parameter = "rho" if isinstance(mech, GaussianNoise) else "epsilon"
        additive = mech if isinstance(mech, GaussianNoise | LaplaceNoise) else None
        definition: dict[str, object] = {
            "mechanism": mech.name,
            parameter: float(mech.rho if isinstance(mech, GaussianNoise) else mech.parameter),
            "granularity_bits": additive.granularity_bits if additive is not None else None,
            "attributes": [
                {"name": a.name, "categories": list(a.categories)} for a in self.attributes
            ],
        }
        if isinstance(mech, PublicCoinBit):
            definition["public_seed"] = mech.public_seed
            definition["groups"] = mech.groups
        if self.household_shared:
            definition["household_shared"] = True
        return definition

    @property
    def digest(self) -> bytes:
        """SHA-256 of the canonical encoding of the question's definition (docs/config.md,
        "Definition digest"): what a report carries to say which definition randomized it."""
        mech = self.mechanism
        value = mech.rho if isinstance(mech, GaussianNoise) else mech.parameter
        additive = mech if isinstance(mech, GaussianNoise | LaplaceNoise) else None
        fields = [
            DIGEST_FORMAT,
            self.id,
            mech.name,
            struct.pack(">d", float(value)).hex(),
            str(additive.granularity_bits) if additive is not None else "",
            str(len(self.attributes)),
        ]
        for attribute in self.attributes:
            fields += [attribute.name, str(len(attribute.categories)), *attribute.categories]
        if isinstance(mech, PublicCoinBit):  # the public subsets are part of the definition
            fields += [f"public_seed={mech.public_seed}", f"groups={mech.groups}"]
        if self.household_shared:  # absent otherwise: untagged questions keep their digests
            fields.append("household_shared")
        encoded = b"".join(
            len(data).to_bytes(4, "big") + data for data in (f.encode() for f in fields)
        )
        return hashlib.sha256(encoded).digest()

    def to_proto(self) -> ldp_pb2.Question:
        mech = self.mechanism
        message = ldp_pb2.Question(
            id=self.id,
            text=self.text,
            attributes=[
                ldp_pb2.Attribute(name=a.name, categories=list(a.categories))
                for a in self.attributes
            ],
            mechanism=MECHANISM_NAMES[mech.name],
            household_shared=self.household_shared,
            repeat=_REPEAT_ENUM[self.repeat],
        )
        if isinstance(mech, GaussianNoise):
            message.rho = mech.rho
        else:
            message.epsilon = mech.parameter
        if isinstance(mech, GaussianNoise | LaplaceNoise):
            message.granularity_bits = mech.granularity_bits
        if isinstance(mech, PublicCoinBit):
            message.public_seed, message.groups = mech.public_seed, mech.groups
        return message

    @classmethod
    def from_proto(cls, message: ldp_pb2.Question) -> QuestionSpec:
        attributes = tuple(Attribute(a.name, tuple(a.categories)) for a in message.attributes)
        names = {v: k for k, v in MECHANISM_NAMES.items()}
        if message.mechanism not in names:
            raise SurveyError(f"question {message.id!r} has no known mechanism")
        parameter = message.rho if message.mechanism == ldp_pb2.GAUSSIAN else message.epsilon
        return build_question(
            message.id,
            message.text,
            attributes,
            names[message.mechanism],
            parameter,
            message.granularity_bits,  # to_proto always sets it; 0 is a valid grid (step 1)
            household_shared=message.household_shared,
            repeat=_repeat_of(message),
            **_coin_fields(message),
        )


def _repeat_of(message: ldp_pb2.Question) -> str:
    """The question's repeat policy; an enum value this device does not know is refused (a
    newer policy it cannot honour)."""
    policy = {v: k for k, v in _REPEAT_ENUM.items()}.get(message.repeat)
    if policy is None:
        raise SurveyError(f"question {message.id!r} has a repeat policy this device does not know")
    return policy


def _coin_fields(message: ldp_pb2.Question) -> dict[str, int]:
    """public_seed and groups of a PUBLIC_COIN_BIT question (proto3 zeros elsewhere)."""
    if message.mechanism != ldp_pb2.PUBLIC_COIN_BIT:
        return {}
    return {"public_seed": message.public_seed, "groups": message.groups}


def _category(label: str, attribute: Attribute) -> int:
    if label in attribute.categories:
        return attribute.categories.index(label)
    raise SurveyError(
        f"{label!r} is not a category of {attribute.name}; valid labels: "
        f"{_listing(attribute.categories)}"
    )


def _listing(labels: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(repr(label) for label in labels[:limit])
    return shown if len(labels) <= limit else f"{shown}, ... ({len(labels)} in all)"


def build_question(
    question_id: str,
    text: str,
    attributes: Sequence[Attribute],
    mechanism: object,
    parameter: float,
    granularity_bits: int = DEFAULT_GRANULARITY_BITS,
    *,
    household_shared: bool = False,
    public_seed: int | None = None,
    groups: int | None = None,
    repeat: object = REFUSE,
) -> QuestionSpec:
    """Validate a question definition and build its mechanism (``mechanism``: one of
    MECHANISM_NAMES, from a parsed file, checked; ``public_seed`` and ``groups``: the public
    subsets of ``public_coin_bit``, required there and refused elsewhere; ``repeat``: one of
    REPEAT_POLICIES)."""
    check_id("question", question_id)
    if repeat == "replace":
        raise SurveyError(f"question {question_id}: {_NO_REPLACE}")
    if not isinstance(repeat, str) or repeat not in REPEAT_POLICIES:
        raise SurveyError(
            f"question {question_id}: repeat must be one of {', '.join(REPEAT_POLICIES)}, "
            f"got {repeat!r}"
        )
    if not isinstance(household_shared, bool):
        raise SurveyError(
            f"question {question_id}: household_shared must be true or false, "
            f"got {household_shared!r}"
        )
    if not attributes:
        raise SurveyError(f"question {question_id}: needs categories or attributes")
    for attribute in attributes:
        if len(attribute.categories) < 2:
            raise SurveyError(
                f"question {question_id}: attribute {attribute.name!r} needs >= 2 distinct "
                "categories"
            )
        repeated = sorted(c for c, n in Counter(attribute.categories).items() if n > 1)
        if repeated:
            raise SurveyError(
                f"question {question_id}: attribute {attribute.name!r} needs distinct "
                f"categories; listed more than once: {', '.join(map(repr, repeated[:5]))}"
            )
    k = math.prod(len(a.categories) for a in attributes)
    if not isinstance(mechanism, str) or mechanism not in MECHANISM_NAMES:
        raise SurveyError(
            f"question {question_id}: unknown mechanism {mechanism!r}; "
            f"choose from {sorted(MECHANISM_NAMES)}"
        )
    coin = mechanism == "public_coin_bit"
    if coin and (public_seed is None or groups is None):
        raise SurveyError(f"question {question_id}: public_coin_bit needs public_seed and groups")
    if not coin and (public_seed is not None or groups is not None):
        raise SurveyError(
            f"question {question_id}: public_seed and groups belong to public_coin_bit only"
        )
    try:
        if coin and public_seed is not None and groups is not None:  # both set: checked above
            mech: Mechanism = PublicCoinBit(k, parameter, public_seed, groups)
        elif mechanism in _EPSILON_ONLY:
            mech = _EPSILON_ONLY[mechanism](k, parameter)
        elif mechanism == "gaussian":
            mech = GaussianNoise(k, parameter, granularity_bits=granularity_bits)
        else:
            mech = LaplaceNoise(k, parameter, granularity_bits=granularity_bits)
    except ValueError as exc:
        raise SurveyError(f"question {question_id}: {exc}") from exc
    return QuestionSpec(question_id, text, tuple(attributes), mech, household_shared, repeat)


def check_id(kind: str, value: object) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise SurveyError(
            f"{kind} id {value!r} must be 1-64 letters, digits, '_', '.', '-' (not leading)"
        )
    return value


MAX_GROUP_VALUES = 64
MAX_GROUP_CHARS = 64


def _check_group_text(survey_id: str, what: str, value: object) -> str:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_GROUP_CHARS
        or not value.isprintable()
    ):
        raise SurveyError(
            f"survey {survey_id}: {what} must be 1-{MAX_GROUP_CHARS} printable characters, "
            f"got {value!r}"
        )
    return value


@dataclass(frozen=True)
class GroupLabel:
    """A survey's public group label (docs/two-sample.md): the study assigns each device one of
    ``values`` (an arm, a region, a wave) and every report carries it unrandomized, so one
    question can be compared across groups."""

    name: str
    values: tuple[str, ...]

    def check(self, survey_id: str) -> None:
        """SurveyError unless the name and 2..64 distinct values are valid."""
        _check_group_text(survey_id, "group_label", self.name)
        values = self.values
        if not isinstance(values, tuple) or not 2 <= len(values) <= MAX_GROUP_VALUES:
            raise SurveyError(
                f"survey {survey_id}: group_values must list 2-{MAX_GROUP_VALUES} values"
            )
        for value in values:
            _check_group_text(survey_id, "every group value", value)
        if len(set(values)) != len(values):
            raise SurveyError(f"survey {survey_id}: group_values must be distinct")


MAX_DESIGN_KEY_CHARS = 64
#: The most keys a sampling frame may list (the store keeps one row of statistics per key and
#: question); also bounds the key digests a survey definition carries (800,000 bytes).
MAX_DESIGN_KEYS = 100_000
#: The first string of a design key's digest (docs/wire.md §3.12), and the digest's length.
DESIGN_KEY_DIGEST_FORMAT = "ldp-design-key/1"
DESIGN_KEY_DIGEST_BYTES = 8
#: The largest release threshold: more reports than any survey collects, and far inside the
#: wire's uint64 (a larger one once started a server whose GetSurvey could not encode it).
MAX_MIN_BATCH_SIZE = 10**9


def design_key_digest(key: str) -> bytes:
    """The public digest of a design key (docs/wire.md §3.12): the first 8 bytes of SHA-256 over
    the format string and the key, each UTF-8 with its length as u32be. A survey publishes its
    frame's digests, not its rows, so a device can check its key before charging its ledger."""
    encoded = b"".join(
        len(data).to_bytes(4, "big") + data
        for data in (DESIGN_KEY_DIGEST_FORMAT.encode(), key.encode())
    )
    return hashlib.sha256(encoded).digest()[:DESIGN_KEY_DIGEST_BYTES]


@dataclass(frozen=True)
class DesignKeys:
    """A survey with a sampling design (docs/designs.md): every report carries its device's
    public design key, a row of the sampling frame the aggregator holds. A device knows the
    frame's key digests (empty: not published, from an older server or definition; then the
    aggregator alone checks membership); the aggregator's frame
    (``aggregator/survey_file/design.py``) extends this with the frame's rows."""

    digests: frozenset[bytes] = frozenset()

    def check_key(self, survey_id: str, key: str) -> str:
        """``key`` if it can be a design key (1-64 printable characters) whose digest is one of
        the frame's (when published), else SurveyError."""
        if not key:
            raise SurveyError(f"survey {survey_id!r} has a sampling design: no design key given")
        if len(key) > MAX_DESIGN_KEY_CHARS or not key.isprintable():
            raise SurveyError(
                f"survey {survey_id!r}: a design key must be 1-{MAX_DESIGN_KEY_CHARS} printable "
                f"characters, got {key[:80]!r}"
            )
        if self.digests and design_key_digest(key) not in self.digests:
            raise SurveyError(unknown_design_key(survey_id, key))
        return key

    @cached_property
    def digest_blob(self) -> bytes:
        """The digests as ``Survey.design_key_digests``: concatenated in ascending order (kept:
        a survey is served many times)."""
        return b"".join(sorted(self.digests))

    @classmethod
    def from_proto(cls, survey_id: str, blob: bytes) -> DesignKeys:
        """The keys of ``Survey.design_key_digests``; SurveyError for a blob that is not whole
        digests or lists more than MAX_DESIGN_KEYS."""
        size = DESIGN_KEY_DIGEST_BYTES
        if len(blob) % size or len(blob) > MAX_DESIGN_KEYS * size:
            raise SurveyError(
                f"survey {survey_id!r}: design_key_digests must be at most {MAX_DESIGN_KEYS:,} "
                f"digests of {size} bytes, got {len(blob):,} bytes"
            )
        return cls(frozenset(blob[i : i + size] for i in range(0, len(blob), size)))


def _design_from_proto(message: ldp_pb2.Survey) -> DesignKeys | None:
    """The survey's design keys on the wire; key digests without a design are a SurveyError."""
    if message.design_key_required:
        return DesignKeys.from_proto(message.id, message.design_key_digests)
    if message.design_key_digests:
        raise SurveyError(f"survey {message.id!r}: design_key_digests without a sampling design")
    return None


def unknown_design_key(survey_id: str, key: str) -> str:
    """Why a key is refused, the same words on the device and on the aggregator."""
    return f"survey {survey_id!r}: unknown design key {key[:80]!r} (not in its sampling frame)"


@dataclass(frozen=True)
class SurveySpec:
    id: str
    title: str
    questions: tuple[QuestionSpec, ...]
    min_batch_size: int
    require_device_auth: bool = False  # uploads must be signed by an enrolled device key
    # Aggregator side only (not on the wire): several members of one household may take part,
    # so reports of questions not tagged household_shared may be clustered (docs/households.md).
    household_members: bool = False
    #: Share of devices on the exploration side of an exploration/confirmation split, in
    #: (0, 1); 0.0 means no split (client/device/split.py, docs/adaptive-analysis.md).
    exploration_fraction: float = 0.0
    #: The public group label every report carries (None: the survey has no groups).
    group_label: GroupLabel | None = None
    #: The survey's sampling design, whose key every report carries (None: no design). Not
    #: part of any question's definition digest, nor of the survey's equality: the frame is an
    #: input of the analysis (it may gain rows), like the categories' scores.
    design: DesignKeys | None = field(default=None, compare=False)

    @property
    def split(self) -> bool:
        return self.exploration_fraction > 0

    def check_group(self, group: str) -> str:
        """``group`` if it fits the survey (one of its group values, or empty for a survey
        without a group label); otherwise SurveyError saying what is expected."""
        label = self.group_label
        if label is None:
            if group:
                raise SurveyError(f"survey {self.id!r} has no group label (got group {group!r})")
            return group
        if group not in label.values:
            expected = ", ".join(label.values)
            what = f"unknown {label.name} {group!r}" if group else f"no {label.name} given"
            raise SurveyError(f"survey {self.id!r}: {what}; expected one of {expected}")
        return group

    def check_design_key(self, key: str) -> str:
        """``key`` if it fits the survey (a key of its design, or empty without a design);
        otherwise SurveyError saying what is expected."""
        if self.design is None:
            if key:
                raise SurveyError(
                    f"survey {self.id!r} has no sampling design (got design key {key[:80]!r})"
                )
            return key
        return self.design.check_key(self.id, key)

    def __post_init__(self) -> None:
        check_id("survey", self.id)
        ids = [q.id for q in self.questions]
        if not ids:
            raise SurveyError(f"survey {self.id}: has no questions")
        if len(set(ids)) != len(ids):
            raise SurveyError(f"survey {self.id}: question ids must be unique")
        if not isinstance(self.min_batch_size, int) or self.min_batch_size < 1:
            raise SurveyError(f"survey {self.id}: min_batch_size must be a positive integer")
        if self.min_batch_size > MAX_MIN_BATCH_SIZE:
            raise SurveyError(
                f"survey {self.id}: min_batch_size must be at most {MAX_MIN_BATCH_SIZE:,}, "
                f"got {self.min_batch_size:,}"
            )
        if not isinstance(self.require_device_auth, bool):
            raise SurveyError(f"survey {self.id}: require_device_auth must be true or false")
        if not isinstance(self.household_members, bool):
            raise SurveyError(f"survey {self.id}: household_members must be true or false")
        fraction = self.exploration_fraction
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not (fraction == 0 or 0 < fraction < 1)
        ):
            raise SurveyError(
                f"survey {self.id}: exploration_fraction must be a number in (0, 1) "
                f"(or 0 for no split), got {fraction!r}"
            )
        if self.group_label is not None:
            self.group_label.check(self.id)

    def question(self, question_id: str) -> QuestionSpec:
        for question in self.questions:
            if question.id == question_id:
                return question
        raise KeyError(question_id)

    def to_proto(self, *, key_digests: bool = False) -> ldp_pb2.Survey:
        """The survey on the wire; ``key_digests``: with its frame's design key digests, which
        only devices need (Collector.GetSurvey, survey files, the device's cache: up to 800,000
        bytes, so listings, analysts and shard manifests go without)."""
        digests = self.design.digest_blob if key_digests and self.design is not None else b""
        return ldp_pb2.Survey(
            id=self.id,
            title=self.title,
            questions=[q.to_proto() for q in self.questions],
            min_batch_size=self.min_batch_size,
            require_device_auth=self.require_device_auth,
            exploration_fraction=self.exploration_fraction,
            group_label=(
                None
                if self.group_label is None
                else ldp_pb2.GroupLabel(
                    name=self.group_label.name, values=list(self.group_label.values)
                )
            ),
            design_key_required=self.design is not None,
            design_key_digests=digests,
        )

    @classmethod
    def from_proto(cls, message: ldp_pb2.Survey) -> SurveySpec:
        return cls(
            message.id,
            message.title,
            tuple(QuestionSpec.from_proto(q) for q in message.questions),
            int(message.min_batch_size),
            message.require_device_auth,
            exploration_fraction=float(message.exploration_fraction),
            group_label=(
                GroupLabel(message.group_label.name, tuple(message.group_label.values))
                if message.HasField("group_label")
                else None
            ),
            design=_design_from_proto(message),
        )


SURVEY_FILE_FORMAT = "ldp-survey-definition/1"


def survey_to_json(survey: SurveySpec) -> str:
    """A survey definition as a file a device can install (``ldp-client install-survey``):
    JSON with a format marker and the wire message's fields (protobuf JSON mapping)."""
    import json  # lazily, as json_format: only survey files need them

    from google.protobuf import json_format

    message = json_format.MessageToDict(
        survey.to_proto(key_digests=True), preserving_proto_field_name=True
    )
    return json.dumps({"format": SURVEY_FILE_FORMAT, "survey": message}, indent=2) + "\n"


def survey_from_json(text: str) -> SurveySpec:
    """Parse and validate a survey definition file; SurveyError if it is not one."""
    import json  # lazily: only survey files need it

    try:
        document = json.loads(text)
    except ValueError as exc:
        raise SurveyError(f"not a survey definition file (invalid JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != SURVEY_FILE_FORMAT:
        raise SurveyError(f"not a survey definition file (expected format {SURVEY_FILE_FORMAT!r})")
    from google.protobuf import json_format  # lazily: only survey files need it

    try:
        message = json_format.ParseDict(document.get("survey"), ldp_pb2.Survey())
    except (json_format.ParseError, TypeError, AttributeError) as exc:
        raise SurveyError(f"invalid survey definition: {exc}") from None
    return SurveySpec.from_proto(message)
