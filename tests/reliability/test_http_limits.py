"""The HTTP worker's connections: one whose request does not all come in within
WORKER_REQUEST_TIMEOUT (10 s by default) is closed, while real wake-ups are still served; one
opened while WORKER_MAX_CONNECTIONS are open is refused at once (worker/http_server.py).

The attack is a real slowloris on the loopback: hundreds of connections that send part of a
request head and then nothing, or a byte a second, as long as the worker lets them."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import psycopg

from tests.support.jobs import enqueue, job, wait_until
from tests.support.workers import wake_to

from .conftest import HTTP, Fleet
from .harness import figures

# hex digits: also a secret Standard Webhooks can sign with (base64)
SECRET = "5a0e1015" * 8
# A slowloris connection gives up on its own after this long: the worker must close it first.
GIVE_UP = 60.0


@dataclass
class Slowloris:
    """`count` connections to 127.0.0.1:`port` that never end a request. With `head`, each
    sends a request head it never ends, then half send nothing more and half a byte a second;
    without, they send nothing at all. Records when the worker closed each one (a reset
    counts), and what it answered."""

    port: int
    count: int
    head: bool = True
    opened: int = 0
    closed_after: list[float] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)

    async def _one(self, n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.opened += 1
        start = time.monotonic()
        trickle = self.head and n % 2 == 1
        if self.head:
            writer.write(
                b"POST /wake HTTP/1.1\r\nHost: worker\r\nContent-Type: application/json\r\n"
            )
        answer = b""
        try:
            async with asyncio.timeout(GIVE_UP):
                while chunk := await self._next(reader, writer, trickle):
                    answer += chunk
        except (ConnectionError, TimeoutError):
            pass
        self.closed_after.append(time.monotonic() - start)
        self.answers.append(answer)
        writer.close()

    @staticmethod
    async def _next(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trickle: bool
    ) -> bytes:
        """What the worker sends next (b"" once it has closed), sending a byte a second
        meanwhile when trickling."""
        while True:
            if trickle:
                writer.write(b"a")  # a header line that never ends
                await writer.drain()
            try:
                return await asyncio.wait_for(reader.read(1024), 1.0)
            except TimeoutError:
                continue

    async def _all(self) -> None:
        await asyncio.gather(*(self._one(n) for n in range(self.count)), return_exceptions=True)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=asyncio.run, args=(self._all(),), daemon=True)
        thread.start()
        return thread

    @property
    def open(self) -> int:
        return self.opened - len(self.closed_after)


def test_slow_requests_are_closed_and_wake_ups_still_served(
    db: psycopg.Connection, fleet: Fleet
) -> None:
    """300 connections that never finish their request head are all closed by the worker
    (after about 10 s, well before they would give up), and a wake-up the database sends
    meanwhile runs its job."""
    worker = fleet(
        HTTP, WAKE_SECRET=SECRET, WORKER_POLL_INTERVAL=3600, WORKER_LINGER_SECONDS=0
    ).start()
    assert worker.port is not None
    attack = Slowloris(worker.port, 300)
    attacking = attack.start()
    wait_until(lambda: attack.opened == attack.count, what="the 300 connections to open")

    wake_to(db, worker, SECRET)  # the real thing: pg_net POSTs after the INSERT commits
    job_id = enqueue(db, "strict_order", order_id=1)
    wait_until(lambda: job(db, job_id)["status"] == "done", what="the woken job to run")
    held_while_served = attack.open

    attacking.join(GIVE_UP + 10)
    assert not attacking.is_alive()
    closed = sorted(attack.closed_after)
    figures(
        "slowloris",
        connections=attack.count,
        open_when_the_job_ran=held_while_served,
        first_closed_s=closed[0],
        median_closed_s=closed[len(closed) // 2],
        last_closed_s=closed[-1],
    )
    assert held_while_served > 0, "the job ran only once the attack was over"
    assert len(closed) == attack.count
    assert closed[-1] < GIVE_UP / 2, "the worker held slow connections as long as they liked"
    assert set(attack.answers) == {b""}, "a slow connection is closed without an answer"


def test_connections_over_the_cap_are_refused_at_once(db: psycopg.Connection, fleet: Fleet) -> None:
    """With WORKER_MAX_CONNECTIONS=50, 80 idle connections: 30 are answered 503 and closed at
    once, the 50 others when their request times out; then a wake-up gets through again."""
    worker = fleet(
        HTTP,
        WAKE_SECRET=SECRET,
        WORKER_POLL_INTERVAL=3600,
        WORKER_LINGER_SECONDS=0,
        WORKER_MAX_CONNECTIONS=50,
        WORKER_REQUEST_TIMEOUT=3,
    ).start()
    assert worker.port is not None
    attack = Slowloris(worker.port, 80, head=False)
    attack.start().join(GIVE_UP + 10)

    refused = [a for a in attack.answers if a.startswith(b"HTTP/1.1 503")]
    timed_out = [a for a in attack.answers if a == b""]
    figures("connection cap", refused=len(refused), timed_out=len(timed_out))
    assert (len(refused), len(timed_out)) == (30, 50)
    [logged] = worker.events("http.connections_refused")
    assert logged["refused"] >= 1

    wake_to(db, worker, SECRET)
    job_id = enqueue(db, "strict_order", order_id=2)
    wait_until(lambda: job(db, job_id)["status"] == "done", what="the woken job to run")
