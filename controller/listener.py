"""One listening socket served by aiohttp on an asyncio loop, with the limits a hostile client meets
before any request is read:

- the TLS handshake has a deadline (`handshake_timeout_s`); an idle or slow connection costs a socket and
  a TLS buffer, never a thread;
- at most `max_connections` are open, counting those still in their handshake (asyncio's TLS layer
  keeps a 256 KiB buffer per connection, so the cap bounds memory too). A connection beyond the cap
  closes the one that has proven least: one still in its handshake, then one that never sent a
  request, then the one idle longest; a connection with a request in progress is never closed for
  another. Only when every connection is busy is the new one refused;
- aiohttp's keep-alive timeout (`idle_timeout_s`) closes a connection that sends no complete request
  line and headers in that time, from its start or after its last answer, however slowly the bytes
  come.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = structlog.get_logger(__name__)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@dataclass(eq=False)
class Connection:
    peer: str
    opened: float
    last_active: float
    task: asyncio.Task[None] | None = None
    transport: asyncio.Transport | None = None
    in_flight: int = 0
    served: int = 0
    closed_for_another: bool = field(default=False)

    def eviction_rank(self) -> tuple[int, float]:
        """Lower goes first: still in the handshake, then never served, then idle longest."""
        if self.transport is None:
            return 0, self.opened
        return (1 if self.served == 0 else 2), self.last_active

    def close(self) -> None:
        self.closed_for_another = True
        if self.transport is not None:
            self.transport.abort()
        elif self.task is not None:
            self.task.cancel()  # asyncio closes the socket of a handshake it abandons


class _Server(web.Server):
    """aiohttp's protocol factory, telling the listener when a connection's protocol goes away."""

    def __init__(self, handler: Handler, listener: Listener, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.listener = listener

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.listener.made(handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.listener.lost(handler)
        super().connection_lost(handler, exc)


class Listener:
    """Accepts on `sock` (already bound and listening) until close(); `ssl_context` None serves plain HTTP."""

    def __init__(self, sock: socket.socket, handler: Handler, *, ssl_context: ssl.SSLContext | None,
                 max_connections: int, idle_timeout_s: float, handshake_timeout_s: float = 5.0, name: str) -> None:
        self.sock = sock
        self.name = name
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.handshake_timeout_s = handshake_timeout_s
        self.connections: set[Connection] = set()
        self._by_protocol: dict[RequestHandler, Connection] = {}
        self.refused = 0
        self.evicted = 0
        # lingering_time 0: a body left unread (a 413, a 408, a review turned away) closes the connection
        # instead of being drained for up to 10 s from a client that may send it a byte at a time
        self._server = _Server(self._tracked(handler), self, keepalive_timeout=idle_timeout_s, access_log=None,
                               max_line_size=8190, max_field_size=8190, lingering_time=0)
        self._accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.sock.setblocking(False)
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop())

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        self.sock.close()
        for conn in list(self.connections):
            conn.close()
        await self._server.shutdown(1.0)

    def _tracked(self, handler: Handler) -> Handler:
        async def tracked(request: web.BaseRequest) -> web.StreamResponse:
            conn = self._by_protocol.get(request.protocol)
            if conn is None:  # already counted out (evicted mid-request cannot happen: it was busy)
                return await handler(request)
            conn.in_flight += 1
            try:
                return await handler(request)
            finally:
                conn.in_flight -= 1
                conn.served += 1
                conn.last_active = time.monotonic()

        return tracked

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(self.sock)
            except OSError as exc:  # EMFILE and the like: the socket stays open, try again shortly
                log.warning("accept failed", listener=self.name, error=str(exc))
                await asyncio.sleep(0.1)
                continue
            self._admit(sock, address)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        if len(self.connections) >= self.max_connections and not self._evict_one():
            self.refused += 1
            log.warning("connection refused: every connection is busy", listener=self.name,
                        client=str(address[0]), connections=len(self.connections))
            sock.close()
            return
        now = time.monotonic()
        conn = Connection(peer=str(address[0]), opened=now, last_active=now)
        self.connections.add(conn)
        conn.task = asyncio.get_running_loop().create_task(self._connect(conn, sock))

    def _evict_one(self) -> bool:
        idle = [c for c in self.connections if c.in_flight == 0 and not c.closed_for_another]
        if not idle:
            return False
        victim = min(idle, key=Connection.eviction_rank)
        self.evicted += 1
        log.info("connection closed for a newer one", listener=self.name, client=victim.peer,
                 connections=len(self.connections), limit=self.max_connections)
        victim.close()
        self.connections.discard(victim)
        return True

    async def _connect(self, conn: Connection, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # answers leave in one write, not after an ACK

        def protocol() -> RequestHandler:
            proto = self._server()
            self._by_protocol[proto] = conn
            return proto

        try:
            if self.ssl_context is None:
                transport, _ = await loop.connect_accepted_socket(protocol, sock)
            else:
                transport, _ = await loop.connect_accepted_socket(
                    protocol, sock, ssl=self.ssl_context, ssl_handshake_timeout=self.handshake_timeout_s)
        except (OSError, ssl.SSLError, asyncio.CancelledError) as exc:
            # a handshake that failed, timed out or was closed for another connection
            log.debug("connection ended before its first request", listener=self.name, client=conn.peer,
                      error=str(exc) or type(exc).__name__)
            self.connections.discard(conn)
            for proto_, owner in list(self._by_protocol.items()):
                if owner is conn:
                    del self._by_protocol[proto_]
            sock.close()
            return
        if conn.closed_for_another:
            transport.abort()

    def made(self, proto: RequestHandler, transport: asyncio.Transport) -> None:
        conn = self._by_protocol.get(proto)
        if conn is not None:
            conn.transport = transport

    def lost(self, proto: RequestHandler) -> None:
        conn = self._by_protocol.pop(proto, None)
        if conn is not None:
            self.connections.discard(conn)
