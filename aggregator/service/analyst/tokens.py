"""Analyst bearer tokens, stored hashed: the file ``serve --analyst-tokens`` checks callers against.

One token per line, ``NAME SHA256-HEX`` (``#`` starts a comment). A token is 32 random bytes,
shown once when minted (``ldp-aggregator analyst-token add``); the file holds only its SHA-256,
so a copy of the file does not let anyone call the Analyst. Tokens are random, not passwords, so
an unsalted hash is enough. A presented token is compared with every stored hash in constant
time. The file is written whole (a temporary file renamed over it) with mode 0600, and a running
server rereads it when it changes: a revoked token stops working without a restart. The server
refuses a token file that others may read or write or that another user owns (at start, one line;
running, by letting nobody in until it is mended): with a writable file anyone could add a token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from pathlib import Path

from aggregator.errors import LdpError
from aggregator.service.private_files import privacy_problem

#: A token's name: what the audit log and the analysis limits know the analyst by.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
#: Every minted token starts with this, so a leaked one is recognisable in logs and scanners.
TOKEN_PREFIX = "ldpa_"


class TokenFileError(LdpError):
    """The token file cannot be read or written, or a line of it is malformed."""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_tokens(path: str | os.PathLike[str]) -> dict[str, str]:
    """The file's tokens, name -> SHA-256 hex (a missing file has none)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"cannot read analyst tokens {path}: {exc}") from None
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if (
            len(fields) != 2
            or not NAME_PATTERN.fullmatch(fields[0])
            or not re.fullmatch(r"[0-9a-f]{64}", fields[1])
        ):
            raise TokenFileError(f"{path}:{number}: expected 'NAME SHA256-HEX'")
        if fields[0] in tokens:
            raise TokenFileError(f"{path}:{number}: token {fields[0]!r} appears twice")
        tokens[fields[0]] = fields[1]
    return tokens


def _write_tokens(path: Path, tokens: dict[str, str]) -> None:
    """Replace the file with ``tokens`` atomically (mode 0600)."""
    text = "# ldp-aggregator analyst tokens: NAME SHA256-HEX (the tokens themselves are not kept)\n"
    text += "".join(f"{name} {digest}\n" for name, digest in sorted(tokens.items()))
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def mint(path: str | os.PathLike[str], name: str) -> str:
    """Add a token named ``name`` to the file (created if missing); the token, to show once."""
    if not NAME_PATTERN.fullmatch(name):
        raise TokenFileError(
            f"token name {name!r}: use 1-64 letters, digits, '.', '_', '@' or '-' "
            "(starting with a letter or digit)"
        )
    tokens = read_tokens(path)
    if name in tokens:
        raise TokenFileError(f"a token named {name!r} exists: revoke it first")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    tokens[name] = token_hash(token)
    _write_tokens(Path(path), tokens)
    return token


def revoke(path: str | os.PathLike[str], name: str) -> None:
    """Remove the token named ``name`` (TokenFileError if there is none)."""
    tokens = read_tokens(path)
    if tokens.pop(name, None) is None:
        raise TokenFileError(f"no analyst token named {name!r} in {path}")
    _write_tokens(Path(path), tokens)


class TokenChecker:
    """The tokens of one file, reread whenever the file changes (size, mtime, inode, mode or
    owner); a file others may read or write, or that another user owns, lets nobody in."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] | None = None
        self._hashes: dict[str, bytes] = {}
        self._refresh()

    def _refresh(self) -> None:
        """Reread the file if it changed; a file that became unreadable or malformed keeps
        nobody in (fail closed) and raises TokenFileError."""
        try:
            info = os.stat(self.path)
            stamp = (info.st_size, info.st_mtime_ns, info.st_ino, info.st_mode, info.st_uid)
        except FileNotFoundError:
            info, stamp = None, (-1, 0, 0, 0, 0)
        with self._lock:
            if stamp == self._stamp:
                return
            try:
                problem = info and privacy_problem(self.path, info, "the analyst token file")
                if problem:
                    raise TokenFileError(problem)
                tokens = read_tokens(self.path)
            except TokenFileError:
                self._stamp, self._hashes = None, {}
                raise
            self._hashes = {name: bytes.fromhex(digest) for name, digest in tokens.items()}
            self._stamp = stamp

    def name_of(self, token: str) -> str | None:
        """The name of ``token``, or None if no stored hash matches. Every stored hash is
        compared, each in constant time, so the timing says nothing about which one is close."""
        self._refresh()
        presented = hashlib.sha256(token.encode()).digest()
        found = None
        for name, digest in self._hashes.items():
            if hmac.compare_digest(presented, digest):
                found = name
        return found
