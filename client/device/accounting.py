"""The accounting formulas the ledger and ``ldp-client budget`` use (privacy-accounting spec).

``rho_cap`` inverts the zCDP conversion (§A.1 item 4), ``zcdp_to_epsilon`` is that conversion,
and ``odometer`` is the zCDP odometer of §B.4: a running "loss so far" bound that holds with
probability ``1 - delta`` at whatever point the device stops, with no budget fixed in advance.
The odometer is for display and audit only; the filter (client/device/ledger.py) enforces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The odometer's window, fixed in advance (§B.4): ``c <= sqrt(2R) <= t c`` covers
#: ``R`` from 1e-4 to 100, i.e. from one report at epsilon 0.014 to 200 reports at epsilon 1.
ODOMETER_C = math.sqrt(2e-4)
ODOMETER_T = 1e3
#: The fallback's preset ``x`` (§B.4, [Rogers2017] Thm 5.4.1) outside the window: 2R at its
#: lower edge.
ODOMETER_X = 2e-4


def rho_cap(excess: float, delta: float) -> float:
    """The largest rho with ``rho + 2 sqrt(rho ln(1/delta)) <= excess`` (0 if ``excess <= 0``),
    in the cancellation-free form ``E^2 / (sqrt(L + E) + sqrt(L))^2``."""
    if excess <= 0:
        return 0.0
    log_term = -math.log(delta)
    return (excess / (math.sqrt(log_term + excess) + math.sqrt(log_term))) ** 2


def zcdp_to_epsilon(xi: float, rho: float, delta: float) -> float:
    """``(xi, rho)``-zCDP as ``(epsilon, delta)``-DP: the smaller of the [Bun2016] form and
    [Rogers2017] Thm 2.2.4's (both valid for the same delta, privacy-accounting spec §A.1
    item 4)."""
    if rho <= 0:
        return xi
    standard = xi + rho + 2 * math.sqrt(rho * math.log(1 / delta))
    log_arg = math.log(math.sqrt(math.pi * rho) / delta)
    return min(standard, xi + rho + 2 * math.sqrt(rho * log_arg)) if log_arg > 0 else standard


@dataclass(frozen=True)
class OdometerReading:
    """The odometer's bound on the loss so far: ``epsilon`` at ``delta``; ``form`` says which
    bound applied ("window" for §B.4's (c, t) form, "fallback" outside it, "exact" for the
    certain basic sum, with ``delta`` 0)."""

    epsilon: float
    delta: float
    form: str


def odometer(rho: float, delta: float, pointwise: float = 0.0) -> OdometerReading:
    """§B.4: ``pointwise + odo(rho)`` for a device that has charged ``rho`` to zCDP and
    ``pointwise`` with certainty; fails with probability at most ``delta``."""
    if rho <= 0:
        return OdometerReading(pointwise, 0.0, "exact")  # basic composition: certain
    if ODOMETER_C <= math.sqrt(2 * rho) <= ODOMETER_T * ODOMETER_C:
        a = math.sqrt(0.74) * math.log(ODOMETER_T)
        beta = (-a + math.sqrt(a * a + delta / (4 * math.sqrt(math.e)))) ** 2
        bound = rho + 2 * math.sqrt(rho * math.log(1 / beta))
        return OdometerReading(pointwise + bound, delta, "window")
    return OdometerReading(pointwise + fallback_bound(rho, delta), delta, "fallback")


def fallback_bound(rho: float, delta: float, x: float = ODOMETER_X) -> float:
    """privacy-accounting spec §B.4's self-normalized bound ([Rogers2017] Thm 5.4.1 with
    V = 2R, ``x`` preset), for any R."""
    spread = (2 * rho + x) * (2 + math.log(2 * rho / x + 1))
    return rho + math.sqrt(spread * math.log(2 / delta))
