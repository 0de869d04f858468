"""Who may call the Analyst service: the analyst listener's credentials and its gate.

The Analyst is served only on its own listener (never beside the Collector). Its callers
authenticate with an analyst client certificate (mTLS against an analyst CA distinct from the
device CA), a bearer token (``authorization: Bearer <token>``, checked against
:mod:`.analyst_tokens`), or both; on a loopback address without either, every caller is the local
user, ``loopback``. The gate runs before every Analyst RPC: a device certificate is
PERMISSION_DENIED, a missing or unknown token UNAUTHENTICATED; the caller's identity (token name,
else the certificate's subject CN) is set in :data:`CALLER` for the analysis limits and the audit
log. gRPC's TLS stack either requires a client certificate or does not ask for one, so with an
analyst CA a caller without any certificate is refused during the handshake (UNAVAILABLE).
"""

from __future__ import annotations

import contextvars
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes

from aggregator.errors import LdpError
from aggregator.service.analyst.tokens import TokenChecker, TokenFileError
from client.device.tls import read_certificates, read_key_pair

#: The identity of the Analyst call being served (None outside one).
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("analyst", default=None)
#: The identity of every caller of a loopback listener without analyst credentials.
LOOPBACK_IDENTITY = "loopback"
#: The methods the gate guards (everything else on the listener, e.g. health, is open).
ANALYST_PREFIX = "/ldp.v1.Analyst/"


class AnalystAccessError(LdpError):
    """The analyst listener's settings would expose the Analyst, or its files are unusable."""


def is_loopback(host: str) -> bool:
    """True for a host name or address that only this machine reaches."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class AnalystAccess:
    """The analyst listener's transport and credentials, as files (picklable for workers).

    ``tls_cert``/``tls_key`` serve TLS (the device listener's server certificate); ``client_ca``
    is the analyst CA (mTLS required); ``device_ca`` is the device CA, trusted in the handshake
    only so that a device certificate is recognised and refused with PERMISSION_DENIED;
    ``tokens`` is the hashed token file."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    device_ca: Path | None = None
    tokens: Path | None = None

    def check(self, host: str) -> None:
        """Refuse settings that would expose the Analyst on ``host`` (AnalystAccessError)."""
        tls = self.tls_cert is not None and self.tls_key is not None
        if self.client_ca is not None and not tls:
            raise AnalystAccessError("--analyst-client-ca needs TLS: pass --tls-cert and --tls-key")
        if (
            self.client_ca is not None
            and self.device_ca is not None
            and _fingerprints(self.client_ca) & _fingerprints(self.device_ca)
        ):
            raise AnalystAccessError(
                "the analyst CA must differ from the device CA (--client-ca): a device "
                "certificate must never pass as an analyst's"
            )
        if is_loopback(host):
            return
        if self.client_ca is None and self.tokens is None:
            raise AnalystAccessError(
                f"the analyst listener on {host} is not loopback: pass --analyst-client-ca "
                "and/or --analyst-tokens (or bind it to 127.0.0.1)"
            )
        if not tls:
            raise AnalystAccessError(
                f"analyst tokens on {host} would cross the network in plaintext: pass "
                "--tls-cert and --tls-key (or bind the analyst listener to 127.0.0.1)"
            )

    def credentials(self) -> grpc.ServerCredentials | None:
        """The listener's gRPC credentials: plaintext, TLS, or mTLS with the analyst CA (plus
        the device CA, so that a device certificate reaches the gate and is refused there)."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        chain, key = read_key_pair(self.tls_cert, self.tls_key, "server")
        if self.client_ca is None:
            return grpc.ssl_server_credentials([(key, chain)])
        roots = read_certificates(self.client_ca, "analyst CA certificate")
        if self.device_ca is not None:
            roots += b"\n" + read_certificates(self.device_ca, "client CA certificate")
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=roots, require_client_auth=True
        )

    def gate(self) -> AnalystGate:
        analyst_cas = () if self.client_ca is None else _load_cas(self.client_ca)
        if self.tokens is not None and not self.tokens.is_file():
            raise AnalystAccessError(
                f"no analyst token file {self.tokens}: mint a token with "
                "ldp-aggregator analyst-token add NAME --tokens FILE"
            )
        try:
            tokens = None if self.tokens is None else TokenChecker(self.tokens)
        except TokenFileError as exc:
            raise AnalystAccessError(str(exc)) from None
        return AnalystGate(analyst_cas, tokens)


def _load_cas(path: Path) -> tuple[x509.Certificate, ...]:
    return tuple(x509.load_pem_x509_certificates(read_certificates(path, "analyst CA")))


def _fingerprints(path: Path) -> set[bytes]:
    return {cert.fingerprint(hashes.SHA256()) for cert in _load_cas(path)}


class RefusedError(Exception):
    """A call the gate turns away: its status code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class AnalystGate(grpc.aio.ServerInterceptor):
    """Authenticates every Analyst RPC and sets :data:`CALLER` for the handler."""

    def __init__(
        self, analyst_cas: tuple[x509.Certificate, ...], tokens: TokenChecker | None
    ) -> None:
        self._cas = analyst_cas
        self._tokens = tokens

    def identify(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's identity, or RefusedError."""
        name = None
        if self._cas:  # mTLS: the handshake already checked the chain and the validity
            pem = (context.auth_context() or {}).get("x509_pem_cert")
            cert = x509.load_pem_x509_certificate(pem[0]) if pem else None
            if cert is None or not any(_issued_by(cert, ca) for ca in self._cas):
                raise RefusedError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "this certificate is not an analyst's: the Analyst service takes analyst "
                    "credentials only",
                )
            cns = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
            name = str(cns[0].value) if cns else cert.subject.rfc4514_string()
        if self._tokens is not None:
            name = self._token_name(context)
        return name or LOOPBACK_IDENTITY

    def _token_name(self, context: grpc.aio.ServicerContext) -> str:
        values = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        if len(values) != 1:
            raise RefusedError(
                grpc.StatusCode.UNAUTHENTICATED,
                "an analyst token is required: send metadata 'authorization: Bearer <token>'",
            )
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise RefusedError(
                grpc.StatusCode.UNAUTHENTICATED, "the authorization metadata is not Bearer <token>"
            )
        assert self._tokens is not None
        try:
            name = self._tokens.name_of(token.strip())
        except TokenFileError as exc:
            raise RefusedError(
                grpc.StatusCode.UNAUTHENTICATED, f"analyst tokens are unreadable: {exc}"
            ) from None
        if name is None:
            raise RefusedError(grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked analyst token")
        return name

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = getattr(details, "method", "") or ""
        if handler is None or not method.startswith(ANALYST_PREFIX):
            return handler
        return guarded(handler, self._enter)

    async def _enter(self, context: grpc.aio.ServicerContext) -> None:
        try:
            CALLER.set(self.identify(context))
        except RefusedError as exc:
            await context.abort(exc.code, str(exc))


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):  # another issuer, signature or key type
        return False
    return True


def guarded(
    handler: grpc.RpcMethodHandler, enter: Callable[[grpc.aio.ServicerContext], Awaitable[Any]]
) -> grpc.RpcMethodHandler:
    """``handler`` with ``await enter(context)`` run first, in the handler's own task (so a
    context variable it sets is seen by the handler); every kind of handler is wrapped, so an
    RPC added later cannot slip past the gate."""
    serializers = (handler.request_deserializer, handler.response_serializer)
    if handler.unary_unary is not None or handler.stream_unary is not None:
        single = handler.unary_unary or handler.stream_unary

        async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await enter(context)
            return await single(request, context)

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(answer, *serializers)
        return grpc.stream_unary_rpc_method_handler(answer, *serializers)
    streaming = handler.unary_stream or handler.stream_stream

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await enter(context)
        async for item in streaming(request, context):
            yield item

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(stream, *serializers)
    return grpc.stream_stream_rpc_method_handler(stream, *serializers)
