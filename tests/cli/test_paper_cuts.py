"""Small things a new user ran into (issue 25): each says what is wrong in one short line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from store.test_definitions import store_with_reports

from aggregator.service.server.tls import server_credentials
from aggregator.store import definitions
from aggregator.store.definitions import DefinitionChangedError
from aggregator.store.sqlite import pins
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from client.device.tls import TlsSettings
from client.device.transport import Transport, TransportError

ROOT = Path(__file__).resolve().parents[2]


def test_gen_pki_outside_the_environment_is_one_line(tmp_path):
    """``-S``: a Python that does not see the installed packages, as outside ``.venv``."""
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "gen_pki.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=60,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'ldp-survey' package" in lines[0]
    assert ".venv/bin/activate" in lines[0]
    assert not list(tmp_path.iterdir())


@pytest.fixture
def mtls_server(tmp_path, survey_file, pki):
    credentials = server_credentials(pki.cert("server"), pki.key("server"), pki.cert("ca"))
    running = ServerThread(survey_file, tmp_path / "reports.sqlite", credentials=credentials)
    yield running.start()
    running.stop()


@pytest.mark.parametrize(
    ("device", "cause"),
    [
        (None, "the server requires a client certificate (mTLS) and this device sent none"),
        ("foreign-device", "the server did not accept the device certificate"),
    ],
)
def test_a_refused_client_certificate_is_named(mtls_server, pki, device, cause):
    cert, key = (None, None) if device is None else (pki.cert(device), pki.key(device))
    tls = TlsSettings(pki.cert("ca"), cert, key)
    with (
        Transport(f"localhost:{mtls_server.port}", tls=tls, max_attempts=1) as transport,
        pytest.raises(TransportError) as failed,
    ):
        transport.get_survey("s1")
    assert failed.value.code.name == "UNAVAILABLE" and str(failed.value).startswith(
        f"UNAVAILABLE: {cause}"
    )
    good = TlsSettings(pki.cert("ca"), pki.cert("device"), pki.key("device"))
    with Transport(f"localhost:{mtls_server.port}", tls=good) as transport:
        assert transport.get_survey("s1").id == "s1"


def test_renaming_one_of_2000_labels_names_that_label_only(tmp_path):
    labels = [f"occupation-{j:04d}" for j in range(2000)]
    config = tmp_path / "s.toml"
    body = (
        '[[survey]]\nid = "s1"\nmin_batch_size = 1\n\n[[survey.question]]\nid = "rr"\n'
        'categories_file = "labels.txt"\nmechanism = "randomized_response"\nepsilon = 1.0\n'
    )
    config.write_text(body)
    (tmp_path / "labels.txt").write_text("\n".join(labels) + "\n")
    db = tmp_path / "reports.sqlite"
    store_with_reports(config, db)
    labels[1234] = "occupation-1234-renamed"
    (tmp_path / "labels.txt").write_text("\n".join(labels) + "\n")
    with ReportStore(db) as store, pytest.raises(DefinitionChangedError) as caught:
        pins.register(store, load_surveys(config), config)
    message = str(caught.value)
    assert len(message) < 400 and message.count("occupation-") == 2, message
    assert "category 1235 is 'occupation-1234-renamed'" in message
    assert "category 1235 = 'occupation-1234'" in message
    done = run_cli("agg", "check-config", config, "--db", db)
    assert done.returncode != 0 and len(done.stderr) < 500 and "category 1235" in done.stderr


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda ls: [*ls, "extra-a", "extra-b"],
            ("categories", "2,000 labels", "2,002 labels, new: 'extra-a', 'extra-b'"),
        ),
        (
            lambda ls: ls[::-1],
            (
                "categories 1, 2, 3 (and 1,997 more of 2,000)",
                "'occupation-0000', 'occupation-0001', 'occupation-0002'",
                "'occupation-1999', 'occupation-1998', 'occupation-1997'",
            ),
        ),
    ],
)
def test_label_changes_are_bounded(edit, expected):
    labels = [f"occupation-{j:04d}" for j in range(2000)]
    stored = {"mechanism": "rr", "attributes": [{"name": "occupation", "categories": labels}]}
    given = {"mechanism": "rr", "attributes": [{"name": "occupation", "categories": edit(labels)}]}
    assert definitions.difference(stored, given) == expected


def test_plan_plot_says_where_and_draws_distinct_curves_beside_a_legend(tmp_path):
    from aggregator.planning.study import plan_study, power_figure, tilted_alternative
    from client.mechanisms import RandomizedResponse

    p0 = np.full(5, 0.2)
    mechanisms = [RandomizedResponse(5, 0.5 + 0.25 * j) for j in range(15)]
    plan = plan_study(
        k=5,
        epsilon=1.0,
        alternative=tilted_alternative(p0, 0.1),
        null=p0,
        mechanisms=mechanisms,
        target_power=0.8,
    )
    figure = power_figure(plan)
    axes = figure.axes[0]
    curves = [line for line in axes.get_lines() if line.get_label()[0] != "_"]
    assert len(curves) == 15
    assert len({(line.get_color(), line.get_linestyle()) for line in curves}) == 15
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    legend = axes.get_legend().get_window_extent(renderer)
    assert legend.x0 >= axes.get_window_extent(renderer).x1  # beside the axes, covering nothing

    plot = tmp_path / "power.png"
    done = run_cli("agg", "plan", "--k", "4", "--epsilon", "1", "--effect", "0.2", "--n", "500",
                   "--mechanism", "randomized_response", "--plot", plot, "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert plot.stat().st_size > 10_000
    assert done.stderr.strip() == f"power curves written to {plot.resolve()}"
