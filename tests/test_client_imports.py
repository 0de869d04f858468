"""The device side stays light: using client.mechanisms never imports the aggregator, scipy,
Apache Beam or matplotlib (DESIGN.md, dependency direction)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("scipy", "aggregator", "apache_beam", "matplotlib")

CLIENT_WORKLOAD = """
import client, client.mechanisms
import numpy as np
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

for mech in (RandomizedResponse(4, 1.0), FlipComponents(4, 1.0), GaussianNoise(4, 0.5),
             LaplaceNoise(4, 1.0)):
    report = mech.randomize(2)
    mech.decode(mech.encode(report))
    mech.cost, mech.describe()
    mech.simulate(np.array([0, 1, 2, 3]), np.random.default_rng(0))
RandomizedResponse(4, 1.0).realized_epsilon, FlipComponents(4, 1.0).realized_epsilon
GaussianNoise(4, 8.0, granularity_bits=0).noise_variance
"""

REPORT = """
import json, sys
forbidden = {forbidden!r}
print(json.dumps(sorted(
    name for name in sys.modules if any(name == f or name.startswith(f + ".") for f in forbidden)
)))
"""


def loaded_forbidden_modules(workload: str) -> list[str]:
    """Run ``workload`` in a fresh interpreter and list the forbidden modules it loaded."""
    code = workload + REPORT.format(forbidden=FORBIDDEN)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_client_mechanisms_import_nothing_heavy():
    assert loaded_forbidden_modules(CLIENT_WORKLOAD) == []


def test_the_check_sees_a_forbidden_import():
    """Control: the same probe does report the aggregator and scipy once they are imported."""
    loaded = loaded_forbidden_modules(
        CLIENT_WORKLOAD + "import aggregator.histogram, scipy.stats\n"
    )
    assert "aggregator" in loaded and "aggregator.histogram" in loaded
    assert "scipy" in loaded
