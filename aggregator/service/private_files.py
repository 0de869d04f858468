"""Files holding secrets the server reads (the analyst token file, the limits secret) must belong
to the server's user and be private to it: whoever may write the token file could add a token of
their own, and whoever may read the limits secret could match cap counts against identities."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def privacy_problem(path: Path, info: os.stat_result, what: str) -> str | None:
    """Why ``path`` (stat ``info``), holding ``what``, is not private to the server's user, in
    one line with the mend; None when it is (owned by this user, no group or other bits)."""
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        return f"{path} has mode {mode:04o}: {what} must be private to its owner (chmod 600 {path})"
    if info.st_uid != os.geteuid():
        return (
            f"{path} belongs to uid {info.st_uid}, not to the server's user (uid {os.geteuid()}): "
            f"{what} must be the server's own (chown it, or run the server as its owner)"
        )
    return None
