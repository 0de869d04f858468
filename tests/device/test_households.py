"""Households (privacy-accounting spec D.2, D.3): the household secret and its enrolment code,
the household ledger's group cost, one respondent per household on one device and across
devices (a real aggregator on loopback: the second device's report is a CONFLICT), and the
test guard for questions whose reports may come from several members of one household."""

from __future__ import annotations

import hashlib
import json
import stat
import struct
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.errors import ClusteredReportsError
from aggregator.service.status import status_of
from aggregator.store import checks
from aggregator.store.checks import ReportRejectedError
from aggregator.store.definitions import difference
from aggregator.store.sqlite.reader import StoreReader
from aggregator.survey_file.analyses import check_independent, load_analyses
from aggregator.survey_file.config import ConfigError, load_surveys
from client.device.household import (
    AlreadyAnswered,
    Household,
    HouseholdBudgetExceeded,
    HouseholdError,
    HouseholdTerms,
    create_terms,
    household_secret,
)
from client.device.ledger import Budget
from client.device.repeats import AnsweredBefore
from client.device.reporter import Reporter
from client.device.split import split_secret, split_side
from client.device.transport import Transport
from client.mechanisms.base import PrivacyCost
from client.survey import (
    Attribute,
    QuestionSpec,
    SurveySpec,
    build_question,
    survey_from_json,
    survey_to_json,
)
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEY = """
[[survey]]
id = "home"
min_batch_size = 1
household_members = true

[[survey.question]]
id = "dwelling"
categories = ["flat", "house", "other"]
mechanism = "randomized_response"
epsilon = 1.0
household_shared = true

[[survey.question]]
id = "mood"
categories = ["good", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "tenure"                # epsilon 20: two different answers give different reports
categories = ["own", "rent"]
mechanism = "randomized_response"
epsilon = 20.0
household_shared = true

[[survey]]
id = "plain"
min_batch_size = 1

[[survey.question]]
id = "mood"
categories = ["good", "bad"]
mechanism = "randomized_response"
epsilon = 1.0
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "home.toml"
    path.write_text(SURVEY)
    return path


def rr(epsilon: float) -> PrivacyCost:
    return PrivacyCost("pure", epsilon)


# --- the household secret and its code --------------------------------------------------------


def test_code_round_trips_and_damage_is_refused():
    terms = create_terms(4.0, 0.5, devices=3)
    code = terms.code()
    assert code.startswith("ldph1-") and terms.secret.hex() not in code
    assert HouseholdTerms.from_code(f"  {code.upper()}\n") == terms
    damaged = code[:-3] + ("a" if code[-3] != "a" else "b") + code[-2:]
    with pytest.raises(HouseholdError, match="damaged"):
        HouseholdTerms.from_code(damaged)
    with pytest.raises(HouseholdError, match="not a household code"):
        HouseholdTerms.from_code("hello")


@pytest.mark.parametrize(
    "kwargs", [{"epsilon_cap": -1}, {"epsilon_cap": float("nan")}, {"epsilon_cap": 0}]
)
def test_invalid_terms_are_refused(kwargs):
    with pytest.raises(HouseholdError):
        HouseholdTerms(bytes(32), **kwargs)
    with pytest.raises(HouseholdError, match="devices"):
        HouseholdTerms(bytes(32), 1.0, devices=0)


def test_enrolment_is_private_fixed_and_readable(tmp_path):
    state, other = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    assert household_secret(state) is None
    terms = create_terms(3.0)
    Household.enrol(state, terms, "created").close()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert household_secret(state) == terms.secret
    Household.enrol(state, terms, "joined").close()  # the same household again: a no-op
    with pytest.raises(HouseholdError, match="another household"):
        Household.enrol(state, create_terms(3.0), "joined")
    Reporter(Transport("127.0.0.1:1"), other, Budget(1.0)).close()  # enrolled, no household
    assert household_secret(other) is None


def test_a_household_falls_on_one_side_of_every_split(tmp_path):
    """The split secret of an enrolled device is the household's (spec D.3): every device of the
    household reports on the same side; a device outside it decides alone."""
    terms = create_terms(3.0)
    members = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    for path, source in zip(members, ("created", "joined"), strict=True):
        Household.enrol(path, HouseholdTerms.from_code(terms.code()), source).close()
    alone = split_secret(tmp_path / "c.sqlite")
    assert split_secret(members[0]) == split_secret(members[1]) == terms.secret != alone
    surveys = [f"survey-{i}" for i in range(40)]
    sides = [[split_side(split_secret(p), s, 0.5) for s in surveys] for p in members]
    assert sides[0] == sides[1] and len(set(sides[0])) == 2


def test_report_ids_are_shared_by_the_household_and_unlinkable_across_questions():
    one, two = create_terms(1.0), create_terms(1.0)
    twin = HouseholdTerms.from_code(one.code())
    assert one.report_id("s", "q") == twin.report_id("s", "q")
    assert len(one.report_id("s", "q")) == 16
    ids = {one.report_id("s", "q"), one.report_id("s", "r"), one.report_id("t", "q")}
    ids.add(two.report_id("s", "q"))
    assert len(ids) == 4


# --- the household ledger ---------------------------------------------------------------------


def test_group_cost_and_cap(tmp_path):
    terms = create_terms(4.0, devices=2)
    with Household.enrol(tmp_path / "d.sqlite", terms, "created") as household:
        assert household.charge("s", "q1", rr(1.0)) == 2.0  # 2 devices x epsilon 1
        with pytest.raises(AlreadyAnswered, match="one respondent per household"):
            household.charge("s", "q1", rr(1.0))
        assert household.charge("s", "q2", rr(1.0)) == 2.0
        with pytest.raises(HouseholdBudgetExceeded, match="0 of 4 left"):
            household.check("s", "q3", rr(0.5))
        with pytest.raises(HouseholdBudgetExceeded, match="rho"):
            household.charge("s", "q4", PrivacyCost("zcdp", 0.1))  # no rho cap
        assert household.spent() == (4.0, 0.0)
        assert household.status()["shared_answers"] == 2


# --- the tag in the survey model --------------------------------------------------------------


def test_tag_is_in_the_digest_the_wire_and_the_survey_file(config):
    surveys = load_surveys(config)
    shared = surveys["home"].question("dwelling")
    assert shared.household_shared and surveys["home"].household_members
    untagged = build_question("dwelling", "", shared.attributes, "randomized_response", 1.0)
    assert untagged.digest != shared.digest
    assert QuestionSpec.from_proto(shared.to_proto()) == shared
    assert survey_from_json(survey_to_json(surveys["home"])).question("dwelling") == shared
    field = difference(untagged.definition(), shared.definition())
    assert field == ("household_shared", "False", "True")
    assert "household_shared" not in untagged.definition()  # untagged definitions unchanged


def test_empty_digest_is_refused_for_a_shared_question(config):
    question = load_surveys(config)["home"].question("dwelling")
    with pytest.raises(ReportRejectedError) as refused:
        checks.check_digests(question, [b""])
    assert status_of(refused.value.reason) == grpc.StatusCode.FAILED_PRECONDITION
    checks.check_digests(question, [question.digest])


# --- one respondent per household, on one device and across devices --------------------------


def test_one_respondent_per_household_on_a_real_aggregator(tmp_path, config):
    db = tmp_path / "reports.sqlite"
    server = ServerThread(config, db).start()
    terms = create_terms(50.0, devices=2)
    tablet, phone, stranger = (tmp_path / f"{n}.sqlite" for n in ("tablet", "phone", "stranger"))
    try:
        with Transport(server.target) as transport:
            devices = {}
            for path, source in ((tablet, "created"), (phone, "joined")):
                Household.enrol(path, HouseholdTerms.from_code(terms.code()), source).close()
                devices[path] = Reporter(transport, path, Budget(30.0))
            first = devices[tablet].answer("home", "dwelling", "house")
            with pytest.raises(AnsweredBefore):  # a second answer on the same tablet
                devices[tablet].answer("home", "dwelling", "flat")
            devices[tablet].answer("home", "mood", "good")  # not shared: every member answers,
            with pytest.raises(AnsweredBefore):  # each on a device (a state file) of their own
                devices[tablet].answer("home", "mood", "bad")
            assert devices[tablet].flush().accepted == 2

            second = devices[phone].answer("home", "dwelling", "flat")
            assert second == first  # derived from the household secret
            result = devices[phone].flush()
            # CONFLICT, or DUPLICATE when the randomized payloads happen to be equal: never
            # counted twice
            assert result.accepted == 0 and result.rejected + result.duplicate == 1, result
            if result.rejected:
                [(item, code, _)] = devices[phone].outbox.rejected()  # dead-lettered, final
                assert (item.report_id, code) == (first, "CONFLICT")
            assert devices[tablet].ledger.spent()[0] == pytest.approx(2.0)
            status = Household.open(phone).status()
            assert status["spent_epsilon"] == pytest.approx(2.0)  # group cost: 2 x 1

            # different answers at epsilon 20: the second device's report is a CONFLICT
            own = devices[tablet].answer("home", "tenure", "own")
            assert devices[tablet].flush().accepted == 1
            assert devices[phone].answer("home", "tenure", "rent") == own
            result = devices[phone].flush()
            assert (result.accepted, result.duplicate, result.rejected) == (0, 0, 1), result
            [*_, (item, code, _)] = devices[phone].outbox.rejected()  # dead-lettered, final
            assert (item.report_id, code) == (own, "CONFLICT")

            devices[phone].answer("home", "mood", "bad")
            assert devices[phone].flush().accepted == 1

            alone = Reporter(transport, stranger, Budget(10.0))
            with pytest.raises(HouseholdError, match="enrol this device in a household"):
                alone.answer("home", "dwelling", "flat")
            assert alone.ledger.spent() == (0.0, 0.0)  # refused before anything was charged
            for device in (*devices.values(), alone):
                device.close()
    finally:
        server.stop()
    with StoreReader(db) as reader:
        assert reader.statistics("home", "dwelling", 3)[0] == 1  # one report per household
        assert reader.statistics("home", "mood", 2)[0] == 2
        assert reader.statistics("home", "tenure", 2)[0] == 1


# --- the test guard (spec D.3) ----------------------------------------------------------------


def test_guard_refuses_tests_on_questions_members_may_all_answer(config):
    surveys = load_surveys(config)
    home, plain = surveys["home"], surveys["plain"]
    check_independent(home, home.question("dwelling"))  # one respondent per household
    check_independent(plain, plain.question("mood"))  # no household members declared
    with pytest.raises(ClusteredReportsError, match="several members of one household"):
        check_independent(home, home.question("mood"))


def test_declared_analysis_on_a_clustered_question_is_refused(tmp_path, config):
    path = tmp_path / "with_analysis.toml"
    path.write_text(
        SURVEY.replace(
            '[[survey]]\nid = "plain"',
            '[[survey.analysis]]\nquestion = "mood"\ntest = "goodness_of_fit"\n'
            'p0 = [0.5, 0.5]\n\n[[survey]]\nid = "plain"',
        )
    )
    with pytest.raises(ConfigError, match="household_members"):
        load_analyses(path, load_surveys(path))


def test_guard_over_grpc_and_the_command_line(tmp_path, config):
    db = tmp_path / "reports.sqlite"
    server = ServerThread(config, db).start()
    try:
        mood = load_surveys(config)["home"].question("mood")
        reports = [
            ldp_pb2.Report(
                report_id=bytes([i]) * 16,
                survey_id="home",
                question_id="mood",
                payload=mood.mechanism.encode(mood.mechanism.randomize(i % 2)),
                definition_digest=mood.digest,
            )
            for i in range(1, 5)
        ]
        with Transport(server.target) as transport:
            assert all(r.status == ldp_pb2.ACCEPTED for r in transport.upload(reports))
        with grpc.insecure_channel(server.analyst_target) as channel:
            analyst = ldp_pb2_grpc.AnalystStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                analyst.GoodnessOfFit(
                    ldp_pb2.GoodnessOfFitRequest(
                        survey_id="home", question_id="mood", p0=[0.5, 0.5]
                    )
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "household" in refused.value.details()
            estimate = analyst.Estimate(
                ldp_pb2.EstimateRequest(survey_id="home", question_id="mood")
            )
            assert estimate.n == 4  # estimates stay available
    finally:
        server.stop()
    done = run_cli(
        "agg",
        *("test", "--config", str(config)),
        *("--db", str(db), "--survey", "home", "--question", "mood", "gof", "--p0", "0.5,0.5"),
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "household_shared = true" in lines[0]


def test_survey_spec_keeps_members_flag_off_the_wire(config):
    home = load_surveys(config)["home"]
    assert SurveySpec.from_proto(home.to_proto()).household_members is False
    assert json.loads(survey_to_json(home))["survey"].get("household_members") is None


def test_beam_job_results_refuse_tests_on_a_clustered_question(config):
    from aggregator.jobs.partial import Partial
    from aggregator.jobs.results import Analysis, question_result

    home = load_surveys(config)["home"]
    analysis = Analysis(gof={("home", "mood"): (0.5, 0.5), ("home", "dwelling"): (0.4, 0.3, 0.3)})
    clustered = question_result(home, "mood", Partial(4, np.array([2, 2])), analysis)
    assert "household" in clustered["tests"]["gof"]["error"]
    assert clustered["estimate"]["n"] == 4  # the estimate is still released
    shared = question_result(home, "dwelling", Partial(3, np.array([1, 1, 1])), analysis)
    assert "pvalue" in shared["tests"]["gof"]


def test_command_line_household_flow(tmp_path, config):
    server = ServerThread(config, tmp_path / "reports.sqlite").start()
    state = tmp_path / "tablet.sqlite"

    def client(*args: str) -> subprocess.CompletedProcess:
        return run_cli("client", *args)  # in this process (tests/cli_runner.py)

    common = ["--server", server.target, "--insecure", "--state", str(state)]
    submit = [*common, "--survey", "home", "--question", "dwelling"]
    try:
        refused = client("submit", *submit, "--answer", "flat", "--budget", "10", "--best-of")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "enrol this device in a household" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        made = client("household", "create", "--state", str(state), "--cap", "2")
        assert made.returncode == 0 and "ldph1-" in made.stdout
        done = client("submit", *submit, "--answer", "flat", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["flush"]["accepted"] == 1
        again = client("submit", *submit, "--answer", "house")
        assert again.returncode == 2 and "answered home/dwelling already" in again.stderr
        info = json.loads(client("budget", "--state", str(state), "--json").stdout)
        assert info["policy"] == "best-of" and info["charges"] == 1
        assert info["household"]["spent_epsilon"] == 1.0
    finally:
        server.stop()


def test_cost_names_the_household_cap(config):
    from client.budgeting import survey_cost

    cost = survey_cost(load_surveys(config)["home"].questions)
    assert (cost.epsilon, cost.household_epsilon, cost.household_rho) == (22.0, 21.0, 0.0)
    assert cost.to_dict()["household_epsilon"] == 21.0
    done = run_cli("agg", "cost", "--config", str(config), "--survey", "home")
    assert done.returncode == 0 and "household create --cap D x 21 --devices D" in done.stdout


def test_check_config_shows_the_household_settings(config):
    command = ["check-config", str(config)]
    done = run_cli("agg", *command, "--json")
    assert done.returncode == 0, done.stderr
    home = json.loads(done.stdout)["surveys"][0]
    assert home["household_members"] is True
    assert [q.get("household_shared", False) for q in home["questions"]] == [True, False, True]
    text = run_cli("agg", *command).stdout
    assert "dwelling: randomized_response, epsilon = 1, k = 3, household_shared" in text


def test_tagged_digest_follows_the_documented_encoding():
    """docs/config.md field 8, written out independently of client/survey.py."""
    fields = ["ldp-question-definition/1", "q", "randomized_response"]
    fields += [struct.pack(">d", 1.5).hex(), "", "1", "q", "3", "1", "2", "3", "household_shared"]
    data = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
    attributes = [Attribute("q", ("1", "2", "3"))]
    tagged = build_question("q", "", attributes, "randomized_response", 1.5, household_shared=True)
    assert tagged.digest == hashlib.sha256(data).digest()
    untagged = build_question("q", "", attributes, "randomized_response", 1.5)
    assert untagged.digest == hashlib.sha256(data[: -len(b"household_shared") - 4]).digest()


def test_tag_cannot_be_added_once_a_question_has_reports(tmp_path, config):
    db = tmp_path / "reports.sqlite"
    server = ServerThread(config, db).start()
    try:
        with Transport(server.target) as transport:
            mood = transport.get_survey("home").question("mood")
            report = ldp_pb2.Report(
                report_id=bytes(16),
                survey_id="home",
                question_id="mood",
                payload=mood.mechanism.encode(mood.mechanism.randomize(0)),
                definition_digest=mood.digest,
            )
            assert transport.upload([report])[0].status == ldp_pb2.ACCEPTED
    finally:
        server.stop()
    tagged = tmp_path / "tagged.toml"
    tagged.write_text(SURVEY.replace('id = "mood"', 'id = "mood"\nhousehold_shared = true', 1))
    done = run_cli("agg", "check-config", str(tagged), "--db", str(db))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "household_shared is True" in done.stderr and "new id" in done.stderr
