"""Per-device limits counted in the PostgreSQL store, so that every node enforces one cap and one
rate per device (aggregator/service/collector/limits.py says what the limits are; this module only
keeps
their counts).

Devices are named by keyed hashes (the service's KeyPseudonyms), never by an id, certificate
name or address; every node must hash with the same secret, which :meth:`check_secret` checks
against a fingerprint kept in ``node_settings`` (an HMAC of a fixed text: it says nothing of the
secret).

An upload is admitted in one short transaction, caps first (each row increased only if it stays
within its cap), then token buckets (refilled by the database's clock, so the nodes' clocks do
not matter), rows in one order so transactions never wait in a cycle. A refused upload rolls
back: nothing is counted and no token is taken. Cap counts are reserved at admission and the
reports the store did not take as new are handed back after the commit (:meth:`release`), so a
node killed between the two leaves at most that upload's reports counted: a device may then be
refused a few reports below its cap, never allowed one above it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import psycopg

from aggregator.store.device_counts import CountKey, Rate, Refusal
from aggregator.store.errors import StoreError
from aggregator.store.postgres.engine import PostgresStore

#: The ``node_settings`` row of the secret's fingerprint.
SECRET_SETTING = "limits_secret_fingerprint"

_NOW = "extract(epoch from now())"
_RESERVE = """INSERT INTO device_counts AS c VALUES (%s, %s, %s, %s)
ON CONFLICT (pseudonym, survey_id, question_id)
DO UPDATE SET accepted = c.accepted + excluded.accepted
WHERE c.accepted + excluded.accepted <= %s RETURNING accepted"""
_AVAILABLE = f"least(%(burst)s, b.tokens + greatest(0, {_NOW} - b.stamp) * %(rate)s)"
_TAKE = f"""INSERT INTO device_buckets AS b
VALUES (%(key)s, %(survey)s, %(burst)s - %(cost)s, {_NOW})
ON CONFLICT (pseudonym, survey_id) DO UPDATE SET tokens = {_AVAILABLE} - %(cost)s, stamp = {_NOW}
WHERE {_AVAILABLE} >= %(cost)s RETURNING tokens"""
_READ = f"""SELECT {_AVAILABLE} FROM device_buckets b
WHERE pseudonym = %(key)s AND survey_id = %(survey)s"""


class SharedDeviceLimits:
    """The limits' counts of one PostgreSQL store, shared by its nodes."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def check_secret(self, fingerprint: str) -> None:
        """Record the nodes' secret fingerprint (the first node), or StoreError if this node
        hashes with another secret (its counts would not meet the other nodes')."""
        with self._store.transaction() as conn:
            conn.execute(
                "INSERT INTO node_settings VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
                (SECRET_SETTING, fingerprint),
            )
            row = conn.execute(
                "SELECT value FROM node_settings WHERE name = %s", (SECRET_SETTING,)
            ).fetchone()
        if row is None or row[0] != fingerprint:
            raise StoreError(
                "this node's limits secret differs from the other nodes' on this store: give "
                "every node the same <db>.limits-secret (docs/operations.md, 'Several ingest "
                "nodes')"
            )

    def take(
        self,
        key: str,
        wanted: Mapping[CountKey, int],
        caps: Mapping[CountKey, int],
        rates: Sequence[Rate],
    ) -> Refusal | None:
        """Reserve ``wanted`` reports against ``caps`` and charge device ``key``'s ``rates``,
        all or nothing: None when admitted, else the :class:`Refusal` (and nothing changed)."""
        refusal: Refusal | None = None
        with self._store.transaction() as conn:
            for count_key in sorted(wanted):
                n, cap = wanted[count_key], caps[count_key]
                if n > cap or conn.execute(_RESERVE, (*count_key, n, cap)).fetchone() is None:
                    refusal = Refusal(cap=count_key)
                    raise psycopg.Rollback()
            for charge in sorted(rates, key=lambda r: r.survey_id):
                refusal = _charge(conn, key, charge)
                if refusal is not None:
                    raise psycopg.Rollback()
        return refusal

    def release(self, counts: Mapping[CountKey, int]) -> None:
        """Hand back reserved reports the store did not take as new."""
        with self._store.transaction() as conn:
            for key in sorted(counts):
                conn.execute(
                    "UPDATE device_counts SET accepted = greatest(0, accepted - %s)"
                    " WHERE pseudonym = %s AND survey_id = %s AND question_id = %s",
                    (counts[key], *key),
                )

    def accepted(self, key: CountKey) -> int:
        """The reports counted against ``key``'s cap."""
        with self._store.transaction() as conn:
            row = conn.execute(
                "SELECT accepted FROM device_counts WHERE pseudonym = %s AND survey_id = %s"
                " AND question_id = %s",
                key,
            ).fetchone()
        return 0 if row is None else int(row[0])


def _charge(conn: psycopg.Connection, key: str, charge: Rate) -> Refusal | None:
    if charge.cost > charge.burst:
        return Refusal(survey=charge.survey_id, wait=float("inf"))
    values = {
        "key": key,
        "survey": charge.survey_id,
        "burst": charge.burst,
        "cost": charge.cost,
        "rate": charge.rate,
    }
    if conn.execute(_TAKE, values).fetchone() is not None:
        return None
    row = conn.execute(_READ, values).fetchone()
    available = float(row[0]) if row is not None else 0.0
    wait = max(0.0, (charge.cost - available) / charge.rate)
    return Refusal(survey=charge.survey_id, wait=wait)
