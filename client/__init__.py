"""Everything a device runs: mechanisms (and, later, ledger, outbox, transport, CLI)."""
