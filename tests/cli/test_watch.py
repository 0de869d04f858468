"""``ldp-aggregator watch`` over real gRPC (and on the store's release history): the live table,
the survey file's stopping rule, --until-stop on a strong alternative and not under the null,
a server that goes away mid-watch, Ctrl-C, and one-line errors (docs/monitoring.md)."""

from __future__ import annotations

import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

CONFIG = """
[[survey]]
id = "s"
min_batch_size = 50

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0
scores = [4, 3, 2, 1]

[[survey.question]]
id = "calm"
categories = ["yes", "no"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.analysis]]
title = "mood uniform?"
question = "mood"
test = "goodness_of_fit"
p0 = "uniform"
sequential = true

[[survey.analysis]]
title = "calm capped"
question = "calm"
test = "goodness_of_fit"
p0 = [0.5, 0.5]
sequential = true
max_n = 150

[[survey.analysis]]
question = "mood"
test = "goodness_of_fit"
p0 = "uniform"
"""
UNIFORM, STRONG = [0.25] * 4, [0.7, 0.1, 0.1, 0.1]
WAIT = 30


def upload(server, surveys, question_id, truth, n, seed):
    rng = np.random.default_rng(seed)
    mech = surveys["s"].question(question_id).mechanism
    values = mech.simulate(rng.choice(len(truth), size=n, p=truth), rng)
    batch = [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id="s",
            question_id=question_id,
            payload=mech.encode(v),
        )
        for v in values
    ]
    with grpc.insecure_channel(server.target) as channel:
        ldp_pb2_grpc.CollectorStub(channel).Upload(
            ldp_pb2.UploadRequest(reports=batch), timeout=WAIT
        )


@pytest.fixture
def world(tmp_path):
    config = tmp_path / "surveys.toml"
    config.write_text(CONFIG)
    db = tmp_path / "reports.sqlite"
    server = ServerThread(config, db).start()
    yield config, db, server, load_surveys(config)
    server.stop()


def one_line(done, status=2) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == status and len(lines) == 1, done
    assert "Traceback" not in done.stderr
    return lines[0]


def test_once_over_the_server_prints_the_table_and_the_store_agrees(world):
    config, db, server, surveys = world
    upload(server, surveys, "mood", STRONG, 200, 1)
    done = run_cli(
        "agg",
        "watch",
        "--server",
        server.analyst_target,
        "--survey",
        "s",
        "--question",
        "mood",
        "--test",
        "goodness_of_fit",
        "--p0",
        "uniform",
        "--once",
    )
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert lines[0].startswith("as of ") and "anytime-valid" in lines[0]
    assert lines[1].split() == [
        "analysis",
        "category",
        "n",
        "estimate",
        "low",
        "high",
        "e-value",
        "anytime",
        "p",
        "decision",
    ]
    first = lines[2].split()
    assert first[:6] == ["goodness", "of", "fit:", "mood", "great", "200"]
    assert first[-1] in ("continue", "reject")
    assert [line.split()[0] for line in lines[3:6]] == ["fine", "low", "bad"]
    low, high = float(first[7]), float(first[8])
    assert low <= float(first[6]) <= high
    local = run_cli(
        "agg",
        "watch",
        "--config",
        config,
        "--db",
        db,
        "--survey",
        "s",
        "--question",
        "mood",
        "--test",
        "goodness_of_fit",
        "--p0",
        "uniform",
        "--once",
    )
    assert local.returncode == 0 and local.stdout.splitlines()[1:] == lines[1:], local


def test_declared_sequential_analyses_and_waiting_rows(world):
    config, _, server, surveys = world
    upload(server, surveys, "mood", UNIFORM, 100, 2)
    done = run_cli(
        "agg",
        "watch",
        "--server",
        server.analyst_target,
        "--config",
        config,
        "--survey",
        "s",
        "--once",
    )
    assert done.returncode == 3, done  # calm has nothing released yet
    assert "mood uniform?" in done.stdout
    assert "calm capped  waiting: s/calm has fewer than 50 reports" in done.stdout
    assert "goodness of fit: mood" not in done.stdout  # not declared sequential


def test_until_stop_fires_on_a_strong_alternative(world):
    _, _, server, surveys = world
    stop = threading.Event()

    def collect():
        for seed in range(40):
            if stop.wait(0.25):
                return
            upload(server, surveys, "mood", STRONG, 60, 100 + seed)

    feeder = threading.Thread(target=collect)
    feeder.start()
    try:
        done = run_cli(
            "agg",
            "watch",
            "--server",
            server.analyst_target,
            "--survey",
            "s",
            "--question",
            "mood",
            "--test",
            "goodness_of_fit",
            "--p0",
            "uniform",
            "--every",
            "0.2",
            "--until-stop",
            "--timeout",
            "60",
        )
    finally:
        stop.set()
        feeder.join()
    assert done.returncode == 0, done
    fired = done.stdout.splitlines()[-1]
    assert fired.startswith(
        "stopping rule fired: goodness of fit: mood: reject: the e-value passed 20 at n = "
    ), fired


def test_until_stop_does_not_fire_under_the_null_in_a_short_run(world):
    _, _, server, surveys = world
    for seed in range(4):
        upload(server, surveys, "mood", UNIFORM, 60, 200 + seed)
        done = run_cli(
            "agg",
            "watch",
            "--server",
            server.analyst_target,
            "--survey",
            "s",
            "--question",
            "mood",
            "--test",
            "goodness_of_fit",
            "--p0",
            "uniform",
            "--every",
            "0.2",
            "--until-stop",
            "--timeout",
            "0.5",
        )
        assert done.returncode == 1, done
        assert done.stderr.strip() == "no stopping rule fired in 0.5 s"
        assert "continue" in done.stdout


def test_max_n_from_the_survey_file_stops(world):
    config, _, server, surveys = world
    upload(server, surveys, "mood", UNIFORM, 60, 3)
    upload(server, surveys, "calm", [0.5, 0.5], 160, 4)
    done = run_cli(
        "agg",
        "watch",
        "--server",
        server.analyst_target,
        "--config",
        config,
        "--survey",
        "s",
        "--until-stop",
        "--every",
        "0.2",
        "--timeout",
        "20",
    )
    assert done.returncode == 0, done
    assert "stopping rule fired: calm capped: stop at max_n: n = 160 reached max_n = 150" in (
        done.stdout
    )


def test_a_server_that_goes_away_mid_watch_is_retried(world):
    _, _, server, surveys = world
    upload(server, surveys, "mood", UNIFORM, 60, 5)
    port = server.analyst_port
    result = {}

    def watch():
        result["done"] = run_cli(
            "agg",
            "watch",
            "--server",
            f"127.0.0.1:{port}",
            "--survey",
            "s",
            "--question",
            "mood",
            "--every",
            "0.3",
            "--timeout",
            "6",
        )

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(1.0)
    server.stop()
    time.sleep(1.5)
    server.start()  # a new analyst port: the watcher keeps failing, and keeps retrying
    watcher.join()
    done = result["done"]
    assert done.returncode == 0, done
    assert "retrying in 0.3 s" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.count("as of ") >= 2


def test_ctrl_c_exits_130_quietly(world):
    _, _, server, surveys = world
    upload(server, surveys, "mood", UNIFORM, 60, 6)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aggregator.cli",
            "watch",
            "--server",
            server.analyst_target,
            "--survey",
            "s",
            "--question",
            "mood",
            "--every",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith("as of ")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=WAIT)
    assert process.returncode == 130 and err == ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--survey", "nope", "--question", "mood"], "unknown survey 'nope'"),
        (["--survey", "s", "--question", "nope"], "has no question 'nope'"),
        (["--survey", "s", "--question", "mood", "--p0", "uniform"], "--p0 goes with"),
        (["--survey", "s", "--question", "mood", "--test", "goodness_of_fit", "--p0", "1,2"], "p0"),
        (["--survey", "s"], "give --question, or --config"),
        (["--survey", "s", "--question", "mood", "--group", "x"], "group"),
        (["--survey", "s", "--max-n", "10"], "--max-n goes with --question"),
        (["--survey", "s", "--question", "mood", "--every", "0"], "--every must be a positive"),
    ],
)
def test_bad_input_is_one_line(world, extra, words):
    _, _, server, surveys = world
    upload(server, surveys, "mood", UNIFORM, 60, 7)
    done = run_cli("agg", "watch", "--server", server.analyst_target, *extra, "--once")
    assert words in one_line(done)


def test_a_server_that_is_down_is_one_line(world):
    done = run_cli(
        "agg",
        "watch",
        "--server",
        f"127.0.0.1:{free_port()}",
        "--survey",
        "s",
        "--question",
        "mood",
        "--once",
    )
    assert "cannot reach the server" in one_line(done)


def test_a_declared_stopping_rule_is_checked(tmp_path):
    bad = CONFIG.replace("max_n = 150", "max_n = 0")
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    done = run_cli("agg", "check-config", path)
    assert "max_n must be a positive integer, got 0" in one_line(done)
    path.write_text(CONFIG.replace("sequential = true\nmax_n", "sequential = false\nmax_n"))
    done = run_cli("agg", "check-config", path)
    assert "max_n is the stopping rule of a sequential analysis" in one_line(done)
    path.write_text(CONFIG.replace("sequential = true\n\n", 'sequential = "yes"\n\n', 1))
    done = run_cli("agg", "check-config", path)
    assert "sequential must be true or false" in one_line(done)


def test_on_a_terminal_the_table_is_redrawn_in_place(world):
    """A real process on a pseudo-terminal: the second table moves the cursor back over the
    first (ANSI: up N lines, clear below) instead of scrolling."""
    _, _, server, surveys = world
    upload(server, surveys, "mood", UNIFORM, 60, 8)
    main, side = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aggregator.cli",
            "watch",
            "--server",
            server.analyst_target,
            "--survey",
            "s",
            "--question",
            "mood",
            "--every",
            "0.3",
            "--timeout",
            "1.5",
        ],
        stdout=side,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(side)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    process.wait(timeout=WAIT)
    os.close(main)
    assert process.returncode == 0
    text = seen.decode()
    assert text.count("as of ") >= 2
    assert "\x1b[6F\x1b[J" in text  # 6 lines: the stamp, the header and 4 categories


def test_the_mean_score_of_an_ordinal_question(world):
    """--test mean_score: one row, the mean score under the survey file's scores, the same over
    the server and from the store; a question not declared ordinal, or no --config, is one
    line."""
    config, db, server, surveys = world
    upload(server, surveys, "mood", STRONG, 200, 3)
    ask = ["--survey", "s", "--question", "mood", "--test", "mean_score", "--once"]
    remote = run_cli("agg", "watch", "--server", server.analyst_target, "--config", config, *ask)
    assert remote.returncode == 0, remote
    row = remote.stdout.splitlines()[2].split()
    assert row[:6] == ["mean", "score:", "mood", "mean", "score", "200"], row
    estimate, low, high = map(float, row[6:9])
    assert 1 <= low <= estimate <= high <= 4  # scores 4..1: STRONG's mean score is 3.4
    assert low < 3.4 < high
    local = run_cli("agg", "watch", "--config", config, "--db", db, *ask)
    assert local.returncode == 0 and local.stdout.splitlines()[1:] == remote.stdout.splitlines()[1:]
    no_config = run_cli("agg", "watch", "--server", server.analyst_target, *ask)
    assert "give --config" in one_line(no_config)
    calm = [*ask[:3], "calm", *ask[4:]]
    not_ordinal = run_cli(
        "agg", "watch", "--server", server.analyst_target, "--config", config, *calm
    )
    assert "not declared ordinal" in one_line(not_ordinal)
