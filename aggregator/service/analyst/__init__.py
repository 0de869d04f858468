"""The Analyst role: estimates, tests, monitoring and explore-then-confirm on released statistics,
on its own listener with its own credentials and audit log."""
