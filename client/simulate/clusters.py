"""The true answers of simulated devices, clustered by PSU (``ldp-client simulate --icc RHO``).

Without clustering (rho = 0) every device draws its answer from its group's truth. With rho > 0
every PSU draws its own answer distribution around the truth, a Dirichlet with concentration
``(1 - rho) / rho``, and its devices draw from that: the draw has mean the truth and variance
``rho p_j (1 - p_j)`` per category, so the indicator of each category has intra-cluster
correlation rho and a cluster of m devices has design effect ``1 + (m - 1) rho`` (Kish). The
devices of one PSU share one draw per question; a group whose truth differs (``--truth-for``)
draws its own around its truth, so within every group the correlation is rho.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from client.survey import QuestionSpec


def concentration(icc: float) -> float:
    """The Dirichlet concentration whose draws give intra-cluster correlation ``icc`` (> 0)."""
    return (1.0 - icc) / icc


def draw_answers(
    rng: np.random.Generator,
    questions: Sequence[QuestionSpec],
    truths: Sequence[dict[str, np.ndarray]],
    groups: np.ndarray,
    clusters: np.ndarray | None,
    icc: float,
) -> dict[str, np.ndarray]:
    """Per question the true answer (category index) of each device: device i is in group
    ``groups[i]`` (whose truths are ``truths[groups[i]]``) and PSU ``clusters[i]`` (None and
    ``icc`` 0: no clusters). Draws group by group, question by question, so that rho = 0 draws
    exactly what ``simulate`` drew before it could cluster."""
    answers = {q.id: np.zeros(groups.size, dtype=np.int64) for q in questions}
    shared: dict[tuple[str, int, bytes], np.ndarray] = {}
    for g, truth in enumerate(truths):
        members = np.flatnonzero(groups == g)
        for q in questions:
            if clusters is None or icc == 0:
                answers[q.id][members] = rng.choice(q.k, size=members.size, p=truth[q.id])
                continue
            for c in np.unique(clusters[members]):
                devices = members[clusters[members] == c]
                key = (q.id, int(c), truth[q.id].tobytes())
                if key not in shared:
                    shared[key] = _around(rng, truth[q.id], concentration(icc))
                answers[q.id][devices] = rng.choice(q.k, size=devices.size, p=shared[key])
    return answers


def _around(rng: np.random.Generator, truth: np.ndarray, scale: float) -> np.ndarray:
    """A Dirichlet draw with mean ``truth`` and concentration ``scale``; a category of truth 0
    stays 0 (a Dirichlet needs positive parameters)."""
    out = np.zeros_like(truth)
    support = truth > 0
    out[support] = rng.dirichlet(scale * truth[support])
    return out / out.sum()
