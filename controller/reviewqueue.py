"""Which review runs next, and which are turned away: at most `running` reviews evaluate at once, at most
`waiting` more are admitted behind them, and one client (a peer address) holds at most `per_client` of
those places. A freed slot goes to the clients in turn, not to whoever queued first, so a client that
keeps 60 reviews queued delays another client's review by one review, not by 60.

A review that is turned away is not judged: the server answers 429 or 503 (Overloaded), so the
apiserver retries or applies the webhook's failurePolicy, and no valid object is ever denied for want
of capacity. Everything here runs on the server's event loop thread; nothing locks.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass


class Overloaded(Exception):
    """No place for this review now: `status` is 429 (this client is over its share) or 503 (the server is
    full, or no slot came free before the review's deadline)."""

    def __init__(self, status: int, reason: str, *, retry_after_s: int | None = 1) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass
class Ticket:
    """One admitted review, from admit() until release()."""

    client: str
    running: bool = False


class ReviewQueue:
    def __init__(self, running: int, waiting: int, per_client: int | None = None) -> None:
        if running < 1 or waiting < 0:
            raise ValueError(f"need at least 1 running review and no negative queue, got {running}/{waiting}")
        places = running + waiting
        per_client = places if per_client is None else per_client
        if per_client < 1:
            raise ValueError(f"each client needs at least 1 review in flight, got {per_client}")
        self.running = running
        self.waiting = waiting
        self.per_client = per_client
        self._running = 0
        self._held: Counter[str] = Counter()  # admitted tickets per client, running or not
        self._waiters: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def admitted(self) -> int:
        return sum(self._held.values())

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._waiters.values())

    def admit(self, client: str) -> Ticket:
        """A place for one review of `client`, or Overloaded at once (before its body is even read)."""
        if self.admitted >= self.running + self.waiting:
            raise Overloaded(503, f"{self.running} reviews running and {self.waiting} admitted behind them")
        if self._held[client] >= self.per_client:
            raise Overloaded(429, f"this client already has {self.per_client} reviews in flight")
        self._held[client] += 1
        return Ticket(client)

    async def start(self, ticket: Ticket, deadline: float) -> None:
        """Wait (in turn with other clients) for a slot to evaluate in, until `deadline` (loop.time())."""
        if self._running < self.running and not self._waiters:
            self._running += 1
            ticket.running = True
            return
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(ticket.client, deque()).append(granted)
        timer = loop.call_at(deadline, self._expire, granted)
        try:
            await granted
        finally:
            timer.cancel()
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                ticket.running = True  # _hand_over counted it; release() gives it back
            else:
                self._forget(ticket.client, granted)

    def release(self, ticket: Ticket) -> None:
        self._held[ticket.client] -= 1
        if self._held[ticket.client] <= 0:
            del self._held[ticket.client]
        if ticket.running:
            ticket.running = False
            self._running -= 1
            self._hand_over()

    def _expire(self, granted: asyncio.Future[None]) -> None:
        if not granted.done():
            granted.set_exception(Overloaded(
                503, f"no review slot came free before its deadline ({self.running} run at once)",
                retry_after_s=None))  # its deadline is the apiserver's: a retry would come too late

    def _forget(self, client: str, granted: asyncio.Future[None]) -> None:
        queue = self._waiters.get(client)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self._waiters[client]

    def _hand_over(self) -> None:
        while self._running < self.running and self._waiters:
            client, queue = next(iter(self._waiters.items()))
            granted = queue.popleft()
            if queue:
                self._waiters.move_to_end(client)  # the next free slot goes to the next client
            else:
                del self._waiters[client]
            if granted.done():
                continue
            self._running += 1
            granted.set_result(None)
