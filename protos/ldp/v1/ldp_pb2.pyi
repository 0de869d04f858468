from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mechanism(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MECHANISM_UNSPECIFIED: _ClassVar[Mechanism]
    RANDOMIZED_RESPONSE: _ClassVar[Mechanism]
    FLIP_COMPONENTS: _ClassVar[Mechanism]
    GAUSSIAN: _ClassVar[Mechanism]
    LAPLACE: _ClassVar[Mechanism]
    OPTIMIZED_UNARY: _ClassVar[Mechanism]
    HADAMARD_RESPONSE: _ClassVar[Mechanism]
    SUBSET_SELECTION: _ClassVar[Mechanism]
    LOCAL_HASHING: _ClassVar[Mechanism]
    PUBLIC_COIN_BIT: _ClassVar[Mechanism]

class RepeatPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPEAT_REFUSE: _ClassVar[RepeatPolicy]
    REPEAT_MEMOIZE: _ClassVar[RepeatPolicy]

class Side(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIDE_UNSPECIFIED: _ClassVar[Side]
    EXPLORATION: _ClassVar[Side]
    CONFIRMATION: _ClassVar[Side]

class ReportStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPORT_STATUS_UNSPECIFIED: _ClassVar[ReportStatus]
    ACCEPTED: _ClassVar[ReportStatus]
    DUPLICATE: _ClassVar[ReportStatus]
    REJECTED: _ClassVar[ReportStatus]
    CONFLICT: _ClassVar[ReportStatus]
MECHANISM_UNSPECIFIED: Mechanism
RANDOMIZED_RESPONSE: Mechanism
FLIP_COMPONENTS: Mechanism
GAUSSIAN: Mechanism
LAPLACE: Mechanism
OPTIMIZED_UNARY: Mechanism
HADAMARD_RESPONSE: Mechanism
SUBSET_SELECTION: Mechanism
LOCAL_HASHING: Mechanism
PUBLIC_COIN_BIT: Mechanism
REPEAT_REFUSE: RepeatPolicy
REPEAT_MEMOIZE: RepeatPolicy
SIDE_UNSPECIFIED: Side
EXPLORATION: Side
CONFIRMATION: Side
REPORT_STATUS_UNSPECIFIED: ReportStatus
ACCEPTED: ReportStatus
DUPLICATE: ReportStatus
REJECTED: ReportStatus
CONFLICT: ReportStatus

class Attribute(_message.Message):
    __slots__ = ("name", "categories")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    categories: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., categories: _Optional[_Iterable[str]] = ...) -> None: ...

class Question(_message.Message):
    __slots__ = ("id", "text", "attributes", "mechanism", "epsilon", "rho", "granularity_bits", "household_shared", "public_seed", "groups", "repeat")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    RHO_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_BITS_FIELD_NUMBER: _ClassVar[int]
    HOUSEHOLD_SHARED_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_SEED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    REPEAT_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    attributes: _containers.RepeatedCompositeFieldContainer[Attribute]
    mechanism: Mechanism
    epsilon: float
    rho: float
    granularity_bits: int
    household_shared: bool
    public_seed: int
    groups: int
    repeat: RepeatPolicy
    def __init__(self, id: _Optional[str] = ..., text: _Optional[str] = ..., attributes: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ..., mechanism: _Optional[_Union[Mechanism, str]] = ..., epsilon: _Optional[float] = ..., rho: _Optional[float] = ..., granularity_bits: _Optional[int] = ..., household_shared: _Optional[bool] = ..., public_seed: _Optional[int] = ..., groups: _Optional[int] = ..., repeat: _Optional[_Union[RepeatPolicy, str]] = ...) -> None: ...

class Survey(_message.Message):
    __slots__ = ("id", "title", "questions", "min_batch_size", "require_device_auth", "exploration_fraction", "group_label", "design_key_required", "design_key_digests")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_DEVICE_AUTH_FIELD_NUMBER: _ClassVar[int]
    EXPLORATION_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GROUP_LABEL_FIELD_NUMBER: _ClassVar[int]
    DESIGN_KEY_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DESIGN_KEY_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    questions: _containers.RepeatedCompositeFieldContainer[Question]
    min_batch_size: int
    require_device_auth: bool
    exploration_fraction: float
    group_label: GroupLabel
    design_key_required: bool
    design_key_digests: bytes
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., questions: _Optional[_Iterable[_Union[Question, _Mapping]]] = ..., min_batch_size: _Optional[int] = ..., require_device_auth: _Optional[bool] = ..., exploration_fraction: _Optional[float] = ..., group_label: _Optional[_Union[GroupLabel, _Mapping]] = ..., design_key_required: _Optional[bool] = ..., design_key_digests: _Optional[bytes] = ...) -> None: ...

class GroupLabel(_message.Message):
    __slots__ = ("name", "values")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("report_id", "survey_id", "question_id", "payload", "definition_digest", "side", "group", "design_key")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DESIGN_KEY_FIELD_NUMBER: _ClassVar[int]
    report_id: bytes
    survey_id: str
    question_id: str
    payload: bytes
    definition_digest: bytes
    side: Side
    group: str
    design_key: str
    def __init__(self, report_id: _Optional[bytes] = ..., survey_id: _Optional[str] = ..., question_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., definition_digest: _Optional[bytes] = ..., side: _Optional[_Union[Side, str]] = ..., group: _Optional[str] = ..., design_key: _Optional[str] = ...) -> None: ...

class ReportResult(_message.Message):
    __slots__ = ("report_id", "status", "code", "reason", "retry_after_ms")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    report_id: bytes
    status: ReportStatus
    code: str
    reason: str
    retry_after_ms: int
    def __init__(self, report_id: _Optional[bytes] = ..., status: _Optional[_Union[ReportStatus, str]] = ..., code: _Optional[str] = ..., reason: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class UploadRequest(_message.Message):
    __slots__ = ("reports", "signature")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[Report]
    signature: bytes
    def __init__(self, reports: _Optional[_Iterable[_Union[Report, _Mapping]]] = ..., signature: _Optional[bytes] = ...) -> None: ...

class UploadResponse(_message.Message):
    __slots__ = ("results", "accepted", "duplicates", "summarized")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZED_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ReportResult]
    accepted: int
    duplicates: int
    summarized: bool
    def __init__(self, results: _Optional[_Iterable[_Union[ReportResult, _Mapping]]] = ..., accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., summarized: _Optional[bool] = ...) -> None: ...

class GetSurveyRequest(_message.Message):
    __slots__ = ("survey_id",)
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    def __init__(self, survey_id: _Optional[str] = ...) -> None: ...

class ListSurveysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSurveysResponse(_message.Message):
    __slots__ = ("surveys",)
    SURVEYS_FIELD_NUMBER: _ClassVar[int]
    surveys: _containers.RepeatedCompositeFieldContainer[Survey]
    def __init__(self, surveys: _Optional[_Iterable[_Union[Survey, _Mapping]]] = ...) -> None: ...

class EstimateRequest(_message.Message):
    __slots__ = ("survey_id", "question_id", "confidence", "side", "group", "design", "ignore_design")
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    IGNORE_DESIGN_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    question_id: str
    confidence: float
    side: Side
    group: str
    design: DesignOptions
    ignore_design: bool
    def __init__(self, survey_id: _Optional[str] = ..., question_id: _Optional[str] = ..., confidence: _Optional[float] = ..., side: _Optional[_Union[Side, str]] = ..., group: _Optional[str] = ..., design: _Optional[_Union[DesignOptions, _Mapping]] = ..., ignore_design: _Optional[bool] = ...) -> None: ...

class DesignOptions(_message.Message):
    __slots__ = ("variance", "replicates", "seed", "correction", "interval", "small_sample")
    VARIANCE_FIELD_NUMBER: _ClassVar[int]
    REPLICATES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SMALL_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    variance: str
    replicates: int
    seed: int
    correction: str
    interval: str
    small_sample: str
    def __init__(self, variance: _Optional[str] = ..., replicates: _Optional[int] = ..., seed: _Optional[int] = ..., correction: _Optional[str] = ..., interval: _Optional[str] = ..., small_sample: _Optional[str] = ...) -> None: ...

class EstimateResponse(_message.Message):
    __slots__ = ("n", "labels", "frequencies", "standard_errors", "ci_low", "ci_high", "confidence", "mechanism", "projected", "interval_method", "deff", "weighting_effect", "clustering_effect", "design", "variance", "design_df", "post_strata", "population", "small_sample", "interval_df")
    N_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FREQUENCIES_FIELD_NUMBER: _ClassVar[int]
    STANDARD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    CI_LOW_FIELD_NUMBER: _ClassVar[int]
    CI_HIGH_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    PROJECTED_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_METHOD_FIELD_NUMBER: _ClassVar[int]
    DEFF_FIELD_NUMBER: _ClassVar[int]
    WEIGHTING_EFFECT_FIELD_NUMBER: _ClassVar[int]
    CLUSTERING_EFFECT_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_FIELD_NUMBER: _ClassVar[int]
    DESIGN_DF_FIELD_NUMBER: _ClassVar[int]
    POST_STRATA_FIELD_NUMBER: _ClassVar[int]
    POPULATION_FIELD_NUMBER: _ClassVar[int]
    SMALL_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_DF_FIELD_NUMBER: _ClassVar[int]
    n: int
    labels: _containers.RepeatedScalarFieldContainer[str]
    frequencies: _containers.RepeatedScalarFieldContainer[float]
    standard_errors: _containers.RepeatedScalarFieldContainer[float]
    ci_low: _containers.RepeatedScalarFieldContainer[float]
    ci_high: _containers.RepeatedScalarFieldContainer[float]
    confidence: float
    mechanism: str
    projected: _containers.RepeatedScalarFieldContainer[float]
    interval_method: str
    deff: _containers.RepeatedScalarFieldContainer[float]
    weighting_effect: _containers.RepeatedScalarFieldContainer[float]
    clustering_effect: _containers.RepeatedScalarFieldContainer[float]
    design: str
    variance: str
    design_df: int
    post_strata: _containers.RepeatedScalarFieldContainer[str]
    population: _containers.RepeatedScalarFieldContainer[float]
    small_sample: str
    interval_df: float
    def __init__(self, n: _Optional[int] = ..., labels: _Optional[_Iterable[str]] = ..., frequencies: _Optional[_Iterable[float]] = ..., standard_errors: _Optional[_Iterable[float]] = ..., ci_low: _Optional[_Iterable[float]] = ..., ci_high: _Optional[_Iterable[float]] = ..., confidence: _Optional[float] = ..., mechanism: _Optional[str] = ..., projected: _Optional[_Iterable[float]] = ..., interval_method: _Optional[str] = ..., deff: _Optional[_Iterable[float]] = ..., weighting_effect: _Optional[_Iterable[float]] = ..., clustering_effect: _Optional[_Iterable[float]] = ..., design: _Optional[str] = ..., variance: _Optional[str] = ..., design_df: _Optional[int] = ..., post_strata: _Optional[_Iterable[str]] = ..., population: _Optional[_Iterable[float]] = ..., small_sample: _Optional[str] = ..., interval_df: _Optional[float] = ...) -> None: ...

class GoodnessOfFitRequest(_message.Message):
    __slots__ = ("survey_id", "question_id", "p0", "alpha", "method", "calibration", "seed", "side", "group", "design", "ignore_design")
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    P0_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    IGNORE_DESIGN_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    question_id: str
    p0: _containers.RepeatedScalarFieldContainer[float]
    alpha: float
    method: str
    calibration: str
    seed: int
    side: Side
    group: str
    design: DesignOptions
    ignore_design: bool
    def __init__(self, survey_id: _Optional[str] = ..., question_id: _Optional[str] = ..., p0: _Optional[_Iterable[float]] = ..., alpha: _Optional[float] = ..., method: _Optional[str] = ..., calibration: _Optional[str] = ..., seed: _Optional[int] = ..., side: _Optional[_Union[Side, str]] = ..., group: _Optional[str] = ..., design: _Optional[_Union[DesignOptions, _Mapping]] = ..., ignore_design: _Optional[bool] = ...) -> None: ...

class IndependenceRequest(_message.Message):
    __slots__ = ("survey_id", "question_id", "alpha", "method", "calibration", "seed", "side", "group", "design", "ignore_design")
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    IGNORE_DESIGN_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    question_id: str
    alpha: float
    method: str
    calibration: str
    seed: int
    side: Side
    group: str
    design: DesignOptions
    ignore_design: bool
    def __init__(self, survey_id: _Optional[str] = ..., question_id: _Optional[str] = ..., alpha: _Optional[float] = ..., method: _Optional[str] = ..., calibration: _Optional[str] = ..., seed: _Optional[int] = ..., side: _Optional[_Union[Side, str]] = ..., group: _Optional[str] = ..., design: _Optional[_Union[DesignOptions, _Mapping]] = ..., ignore_design: _Optional[bool] = ...) -> None: ...

class TwoSampleRequest(_message.Message):
    __slots__ = ("survey_a", "question_a", "survey_b", "question_b", "alpha", "calibration", "seed", "group_a", "group_b", "design", "ignore_design")
    SURVEY_A_FIELD_NUMBER: _ClassVar[int]
    QUESTION_A_FIELD_NUMBER: _ClassVar[int]
    SURVEY_B_FIELD_NUMBER: _ClassVar[int]
    QUESTION_B_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GROUP_A_FIELD_NUMBER: _ClassVar[int]
    GROUP_B_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    IGNORE_DESIGN_FIELD_NUMBER: _ClassVar[int]
    survey_a: str
    question_a: str
    survey_b: str
    question_b: str
    alpha: float
    calibration: str
    seed: int
    group_a: str
    group_b: str
    design: DesignOptions
    ignore_design: bool
    def __init__(self, survey_a: _Optional[str] = ..., question_a: _Optional[str] = ..., survey_b: _Optional[str] = ..., question_b: _Optional[str] = ..., alpha: _Optional[float] = ..., calibration: _Optional[str] = ..., seed: _Optional[int] = ..., group_a: _Optional[str] = ..., group_b: _Optional[str] = ..., design: _Optional[_Union[DesignOptions, _Mapping]] = ..., ignore_design: _Optional[bool] = ...) -> None: ...

class TestResponse(_message.Message):
    __slots__ = ("statistic", "pvalue", "dof", "method", "n", "alpha", "reject", "inconclusive", "reason", "expected", "observed", "mechanism", "calibration", "calibration_reason", "n_draws", "design", "pearson", "eigenvalues", "numerator_df", "denominator_df", "design_df")
    STATISTIC_FIELD_NUMBER: _ClassVar[int]
    PVALUE_FIELD_NUMBER: _ClassVar[int]
    DOF_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    INCONCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_REASON_FIELD_NUMBER: _ClassVar[int]
    N_DRAWS_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    PEARSON_FIELD_NUMBER: _ClassVar[int]
    EIGENVALUES_FIELD_NUMBER: _ClassVar[int]
    NUMERATOR_DF_FIELD_NUMBER: _ClassVar[int]
    DENOMINATOR_DF_FIELD_NUMBER: _ClassVar[int]
    DESIGN_DF_FIELD_NUMBER: _ClassVar[int]
    statistic: float
    pvalue: float
    dof: int
    method: str
    n: int
    alpha: float
    reject: bool
    inconclusive: bool
    reason: str
    expected: _containers.RepeatedScalarFieldContainer[float]
    observed: _containers.RepeatedScalarFieldContainer[float]
    mechanism: str
    calibration: str
    calibration_reason: str
    n_draws: int
    design: str
    pearson: float
    eigenvalues: _containers.RepeatedScalarFieldContainer[float]
    numerator_df: float
    denominator_df: float
    design_df: int
    def __init__(self, statistic: _Optional[float] = ..., pvalue: _Optional[float] = ..., dof: _Optional[int] = ..., method: _Optional[str] = ..., n: _Optional[int] = ..., alpha: _Optional[float] = ..., reject: _Optional[bool] = ..., inconclusive: _Optional[bool] = ..., reason: _Optional[str] = ..., expected: _Optional[_Iterable[float]] = ..., observed: _Optional[_Iterable[float]] = ..., mechanism: _Optional[str] = ..., calibration: _Optional[str] = ..., calibration_reason: _Optional[str] = ..., n_draws: _Optional[int] = ..., design: _Optional[str] = ..., pearson: _Optional[float] = ..., eigenvalues: _Optional[_Iterable[float]] = ..., numerator_df: _Optional[float] = ..., denominator_df: _Optional[float] = ..., design_df: _Optional[int] = ...) -> None: ...

class PreregisterRequest(_message.Message):
    __slots__ = ("survey_id", "plan")
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    plan: str
    def __init__(self, survey_id: _Optional[str] = ..., plan: _Optional[str] = ...) -> None: ...

class PreregisterResponse(_message.Message):
    __slots__ = ("plan_sha256", "registered_at", "already")
    PLAN_SHA256_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    ALREADY_FIELD_NUMBER: _ClassVar[int]
    plan_sha256: str
    registered_at: str
    already: bool
    def __init__(self, plan_sha256: _Optional[str] = ..., registered_at: _Optional[str] = ..., already: _Optional[bool] = ...) -> None: ...

class ConfirmRequest(_message.Message):
    __slots__ = ("survey_id",)
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    def __init__(self, survey_id: _Optional[str] = ...) -> None: ...

class ConfirmResponse(_message.Message):
    __slots__ = ("plan_sha256", "sealed_at", "results_json", "already")
    PLAN_SHA256_FIELD_NUMBER: _ClassVar[int]
    SEALED_AT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ALREADY_FIELD_NUMBER: _ClassVar[int]
    plan_sha256: str
    sealed_at: str
    results_json: str
    already: bool
    def __init__(self, plan_sha256: _Optional[str] = ..., sealed_at: _Optional[str] = ..., results_json: _Optional[str] = ..., already: _Optional[bool] = ...) -> None: ...

class HoldoutRequest(_message.Message):
    __slots__ = ("survey_id", "question_id", "test", "p0")
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEST_FIELD_NUMBER: _ClassVar[int]
    P0_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    question_id: str
    test: str
    p0: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, survey_id: _Optional[str] = ..., question_id: _Optional[str] = ..., test: _Optional[str] = ..., p0: _Optional[_Iterable[float]] = ...) -> None: ...

class HoldoutResponse(_message.Message):
    __slots__ = ("reject", "level", "query", "max_queries", "rejections", "max_rejections", "alpha", "guarantee")
    REJECT_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MAX_QUERIES_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    reject: bool
    level: float
    query: int
    max_queries: int
    rejections: int
    max_rejections: int
    alpha: float
    guarantee: str
    def __init__(self, reject: _Optional[bool] = ..., level: _Optional[float] = ..., query: _Optional[int] = ..., max_queries: _Optional[int] = ..., rejections: _Optional[int] = ..., max_rejections: _Optional[int] = ..., alpha: _Optional[float] = ..., guarantee: _Optional[str] = ...) -> None: ...

class StatisticsRequest(_message.Message):
    __slots__ = ("survey_id", "question_id", "test", "side", "group")
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEST_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    question_id: str
    test: bool
    side: Side
    group: str
    def __init__(self, survey_id: _Optional[str] = ..., question_id: _Optional[str] = ..., test: _Optional[bool] = ..., side: _Optional[_Union[Side, str]] = ..., group: _Optional[str] = ...) -> None: ...

class StatisticsResponse(_message.Message):
    __slots__ = ("n", "values", "definition_digest")
    N_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_DIGEST_FIELD_NUMBER: _ClassVar[int]
    n: int
    values: _containers.RepeatedScalarFieldContainer[float]
    definition_digest: bytes
    def __init__(self, n: _Optional[int] = ..., values: _Optional[_Iterable[float]] = ..., definition_digest: _Optional[bytes] = ...) -> None: ...

class MonitorRequest(_message.Message):
    __slots__ = ("survey_id", "question_id", "analysis", "p0", "alpha", "max_n", "side", "group", "group_a", "group_b", "with_path", "scores")
    SURVEY_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    P0_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    MAX_N_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_A_FIELD_NUMBER: _ClassVar[int]
    GROUP_B_FIELD_NUMBER: _ClassVar[int]
    WITH_PATH_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    survey_id: str
    question_id: str
    analysis: str
    p0: _containers.RepeatedScalarFieldContainer[float]
    alpha: float
    max_n: int
    side: Side
    group: str
    group_a: str
    group_b: str
    with_path: bool
    scores: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, survey_id: _Optional[str] = ..., question_id: _Optional[str] = ..., analysis: _Optional[str] = ..., p0: _Optional[_Iterable[float]] = ..., alpha: _Optional[float] = ..., max_n: _Optional[int] = ..., side: _Optional[_Union[Side, str]] = ..., group: _Optional[str] = ..., group_a: _Optional[str] = ..., group_b: _Optional[str] = ..., with_path: _Optional[bool] = ..., scores: _Optional[_Iterable[float]] = ...) -> None: ...

class MonitorLook(_message.Message):
    __slots__ = ("n", "log_evalue", "estimate", "low", "high")
    N_FIELD_NUMBER: _ClassVar[int]
    LOG_EVALUE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    n: int
    log_evalue: float
    estimate: _containers.RepeatedScalarFieldContainer[float]
    low: _containers.RepeatedScalarFieldContainer[float]
    high: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, n: _Optional[int] = ..., log_evalue: _Optional[float] = ..., estimate: _Optional[_Iterable[float]] = ..., low: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ...) -> None: ...

class MonitorResponse(_message.Message):
    __slots__ = ("n", "labels", "estimate", "low", "high", "interval_guarantee", "evalue", "max_evalue", "pvalue", "rejected_at", "test_guarantee", "method", "decision", "alpha", "max_n", "looks")
    N_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    EVALUE_FIELD_NUMBER: _ClassVar[int]
    MAX_EVALUE_FIELD_NUMBER: _ClassVar[int]
    PVALUE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_AT_FIELD_NUMBER: _ClassVar[int]
    TEST_GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    MAX_N_FIELD_NUMBER: _ClassVar[int]
    LOOKS_FIELD_NUMBER: _ClassVar[int]
    n: int
    labels: _containers.RepeatedScalarFieldContainer[str]
    estimate: _containers.RepeatedScalarFieldContainer[float]
    low: _containers.RepeatedScalarFieldContainer[float]
    high: _containers.RepeatedScalarFieldContainer[float]
    interval_guarantee: str
    evalue: float
    max_evalue: float
    pvalue: float
    rejected_at: int
    test_guarantee: str
    method: str
    decision: str
    alpha: float
    max_n: int
    looks: _containers.RepeatedCompositeFieldContainer[MonitorLook]
    def __init__(self, n: _Optional[int] = ..., labels: _Optional[_Iterable[str]] = ..., estimate: _Optional[_Iterable[float]] = ..., low: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ..., interval_guarantee: _Optional[str] = ..., evalue: _Optional[float] = ..., max_evalue: _Optional[float] = ..., pvalue: _Optional[float] = ..., rejected_at: _Optional[int] = ..., test_guarantee: _Optional[str] = ..., method: _Optional[str] = ..., decision: _Optional[str] = ..., alpha: _Optional[float] = ..., max_n: _Optional[int] = ..., looks: _Optional[_Iterable[_Union[MonitorLook, _Mapping]]] = ...) -> None: ...
