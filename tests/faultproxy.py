"""A loopback TCP proxy that injects network faults into gRPC calls, for the crash tests.

It reads the HTTP/2 frame headers flowing through it (9 bytes: length, type, flags, stream id), so
it can fail one *call* at a precise point rather than at a random byte:

* ``drop_ack``: the whole request reaches the server, but the connection is closed as soon as the
  server starts answering (its first HEADERS frame on that stream), so the client never sees the
  answer. The server has already done the work: a resend must come back as a duplicate.
* ``reset``: the connection is reset (TCP RST) halfway through the request's first DATA frame,
  so the server never sees a whole request.
* ``cancel``: the request's HEADERS reach the server, then both sides get RST_STREAM(CANCEL) for
  that stream and the connection is closed: the server never runs the call, and the client sees
  CANCELLED, as when a server cancels calls while it shuts down.
* ``delay``: the request is held back for a random time before it is forwarded.
* ``stall``: with ``stall_from_call`` = n set, from the n-th call on (counting from 1) nothing the
  server sends on that stream (or after it) reaches the client until the proxy stops: a client
  killed meanwhile never got its answer.

Each new call (a client HEADERS frame opening a stream) draws its fate from one seeded
``random.Random``; the counters say how often each fault fired. The proxy runs its own event loop
in a daemon thread so that tests can use the synchronous gRPC client.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
DATA, HEADERS, RST_STREAM = 0x0, 0x1, 0x3
CANCEL = 0x8  # HTTP/2 error code


@dataclass(frozen=True)
class FaultPlan:
    """Per-call probabilities of each fault (the rest pass untouched) and the delay range."""

    drop_ack: float = 0.0
    reset: float = 0.0
    cancel: float = 0.0
    delay: float = 0.0
    delay_seconds: tuple[float, float] = (0.005, 0.05)
    stall_from_call: int | None = None

    def __post_init__(self) -> None:
        faults = (self.drop_ack, self.reset, self.cancel)
        if min(*faults, self.delay) < 0 or sum(faults) > 1:
            raise ValueError("probabilities must be >= 0 and drop_ack + reset + cancel <= 1")


_Pair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Connection:
    """One client connection and its upstream connection, with the fate of each call."""

    def __init__(self, proxy: FaultProxy, client: _Pair, upstream: _Pair) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.server_reader, self.server_writer = upstream
        self.fates: dict[int, str] = {}
        self.closed = asyncio.Event()

    async def run(self) -> None:
        pumps = [
            asyncio.ensure_future(self._client_to_server()),
            asyncio.ensure_future(self._server_to_client()),
        ]
        await self.closed.wait()
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

    def shut(self, *, reset: bool) -> None:
        """Close both sides; with ``reset`` the client sees a TCP RST instead of a FIN."""
        if self.closed.is_set():
            return
        for writer in (self.client_writer, self.server_writer):
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()
        self.closed.set()

    async def _client_to_server(self) -> None:
        try:
            preface = await self.client_reader.readexactly(len(PREFACE))
            await self._forward(self.server_writer, preface)
            while True:
                header, payload = await _read_frame(self.client_reader)
                kind, stream = header[3], _stream_id(header)
                if kind == HEADERS and stream not in self.fates:
                    fate = self.proxy.draw()
                    self.fates[stream] = fate
                    if fate == "delay":
                        await asyncio.sleep(self.proxy.delay_seconds())
                    elif fate == "cancel":
                        self.proxy.count("cancel")  # before the client can see it
                        reset_stream = _rst_stream(stream, CANCEL)
                        await self._forward(self.server_writer, header + payload + reset_stream)
                        await self._forward(self.client_writer, reset_stream)
                        self.shut(reset=False)
                        return
                elif kind == DATA and self.fates.get(stream) == "reset":
                    await self._forward(self.server_writer, header + payload[: len(payload) // 2])
                    self.proxy.count("reset")
                    self.shut(reset=True)
                    return
                await self._forward(self.server_writer, header + payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.shut(reset=False)

    async def _server_to_client(self) -> None:
        try:
            while True:
                header, payload = await _read_frame(self.server_reader)
                fate = self.fates.get(_stream_id(header))
                if header[3] == HEADERS and fate == "drop_ack":
                    self.proxy.count("drop_ack")
                    self.shut(reset=False)
                    return
                if header[3] == HEADERS and fate == "stall":
                    self.proxy.count("stall")
                    await asyncio.Event().wait()  # hold everything until the proxy stops
                await self._forward(self.client_writer, header + payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.shut(reset=False)

    @staticmethod
    async def _forward(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    header = await reader.readexactly(FRAME_HEADER)
    length = int.from_bytes(header[:3], "big")
    return header, await reader.readexactly(length)


def _rst_stream(stream: int, error_code: int) -> bytes:
    """An RST_STREAM frame: 4-byte payload holding the error code."""
    return (
        (4).to_bytes(3, "big")
        + bytes([RST_STREAM, 0])
        + stream.to_bytes(4, "big")
        + (error_code.to_bytes(4, "big"))
    )


def _stream_id(header: bytes) -> int:
    return int.from_bytes(header[5:9], "big") & 0x7FFF_FFFF


class FaultProxy:
    """Listens on an ephemeral loopback port and forwards to ``upstream`` ("host:port").

    ``plan`` may be replaced while the proxy runs; calls opened afterwards follow the new plan.
    """

    def __init__(self, upstream: str, plan: FaultPlan, seed: int) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self.plan = plan
        self._rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._connections: set[_Connection] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._server = future.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Close the listener and every open connection, then stop the loop."""

        async def close_all() -> None:
            self._server.close()
            for connection in list(self._connections):
                connection.shut(reset=False)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def draw(self) -> str:
        """The fate of a new call: a fault by its probability, else "pass" (or "stall")."""
        with self._lock:
            self.counts["calls"] += 1
            roll = self._rng.random()
            plan = self.plan
            if roll < plan.drop_ack:
                return "drop_ack"
            if roll < plan.drop_ack + plan.reset:
                return "reset"
            if roll < plan.drop_ack + plan.reset + plan.cancel:
                return "cancel"
            if self._rng.random() < plan.delay:
                self.counts["delay"] += 1
                return "delay"
            stall = (
                plan.stall_from_call is not None and self.counts["calls"] >= plan.stall_from_call
            )
            return "stall" if stall else "pass"

    def delay_seconds(self) -> float:
        with self._lock:
            return self._rng.uniform(*self.plan.delay_seconds)

    def count(self, fault: str) -> None:
        with self._lock:
            self.counts[fault] += 1

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["connections"] += 1
        try:
            upstream = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            return
        connection = _Connection(self, (reader, writer), upstream)
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
