"""Composing a burst before it falls due.

Ten thousand reminders due in the same second: reading, composing and merging them was half of
the firing pass that starts at that second (bench/bench_reminders.py). The timer asks for it
``LEAD`` before an instant that ``AT_LEAST`` reminders share: :meth:`Ahead.prepare` reads the text
reminders due exactly then and composes their messages (off the event loop), in batches a chat's
together. Nothing is written ahead of time.

Several processes compose the same instant; each starts firing at its own share of the batches
(its place among the living processes, read when it composes), so that they mostly claim different
batches (see :meth:`Ahead.take`).

When the instant comes, the firing pass claims each prepared batch's rows by id in its
transaction (:meth:`reminders.store.ReminderStore.claim_sync`: still active, still due then, on
PostgreSQL locked and skipped when another process holds them). Only when it claims exactly the
rows the batch was composed from, in the same chats, does it commit what was prepared; otherwise
(one deleted or moved meanwhile, or partly claimed by another process) it composes the rows it
did claim, as an ordinary pass would. A reminder created for that instant after the preparation,
or one a batch missed, is due as ever and fired by the ordinary pass that follows.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from reminders.firing import ON_TIME, Draft, Outcome, merge
from reminders.store import Reminder, ReminderStore
from robot import OutgoingMessage

__all__ = ["AT_LEAST", "LEAD", "Ahead", "Fired", "Place", "Prepared"]

log = logging.getLogger("reminders.service")

LEAD = timedelta(seconds=5)
"""How long before a busy instant its messages are composed."""
AT_LEAST = 100
"""An instant this many armed reminders share is composed ahead; fewer are not worth a query."""
_MOST = 20_000  # reminders composed ahead per instant (the timer's max_armed); any more fire as ever

Place = tuple[int, int]
"""This process's index among the living processes, and how many they are."""
Fired = tuple[Reminder, Outcome]
"""A reminder's state after firing, and how it went."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """One batch composed ahead: what its reminders become, and the messages they send (only what
    the commit needs is kept: 10,000 reminders held 15.5 MB with their drafts and former states, 11.4 MB
    without)."""

    at: datetime
    fired: tuple[Fired, ...]
    messages: tuple[OutgoingMessage, ...]
    keys: tuple[str | None, ...]

    @property
    def ids(self) -> list[str]:
        return [r.id for r, _ in self.fired]

    def rows(self) -> set[tuple[str, str]]:
        """``(id, chat)`` of the rows the batch was composed from."""
        return {(r.id, r.chat) for r, _ in self.fired}


class Ahead:
    """This process's batches composed ahead, per instant."""

    def __init__(self, store: ReminderStore, compose: Callable[[Reminder, datetime], tuple[Reminder, Outcome,
                                                                                             Draft | None]],
                 *, merge_chat: bool, batch: Callable[[], int], clock: Callable[[], datetime],
                 place: Callable[[], Awaitable[Place | None]] | None = None) -> None:
        self.store = store
        self.clock = clock
        self.compose = compose
        self.merge_chat = merge_chat
        self.batch = batch  # read at each preparation: tests shrink the service's batch
        self.place = place
        self._ready: dict[datetime, tuple[list[Prepared], Place | None]] = {}

    async def prepare(self, at: datetime) -> int:
        """Compose the text reminders due exactly at ``at``; how many (0: too few to bother, or too late)."""
        if self.clock() >= at:  # (a job run late) the pass composes them
            return 0
        rows = await self.store.db.run(lambda db: self.store.due_at_sync(db, at, _MOST))
        if len(rows) < AT_LEAST:
            return 0
        place = None
        if self.place is not None:
            try:
                place = await self.place()
            except Exception:  # (a random start instead)
                log.warning("reminders: reading the living processes failed", exc_info=True)
        self._ready[at] = await asyncio.to_thread(self._compose_all, rows, at), place
        return len(rows)

    def take(self, now: datetime) -> list[Prepared]:
        """The batches of the instants due by ``now`` (forgotten here), if they are still on time.

        In an order of this process's own, a rotation of them: process ``k`` of ``n`` living starts at
        the ``k``-th of ``n`` equal shares, so that processes firing the same instant claim different
        batches and each stops where the next one's share begins. Random starts left one process
        a long run of batches and another a short one (and a random start is taken when the place is
        unknown).
        """
        out: list[Prepared] = []
        for at in sorted(a for a in self._ready if a <= now):
            batches, place = self._ready.pop(at)
            if now - at <= ON_TIME and batches:  # later, the messages need a late note: composed again
                index, count = place or (random.randrange(len(batches)), len(batches))
                turn = index * len(batches) // count
                out.extend(batches[turn:] + batches[:turn])
        return out

    def _compose_all(self, rows: Sequence[Reminder], at: datetime) -> list[Prepared]:
        out: list[Prepared] = []
        size = self.batch()
        start = 0
        while start < len(rows):
            end = min(start + size, len(rows))
            while end < len(rows) and end - start < 2 * size and rows[end].chat == rows[end - 1].chat:
                end += 1  # a chat's reminders in one batch share their message
            part = rows[start:end]
            fired = [(r, *self.compose(r, at)) for r in part]
            messages, keys = merge(fired, at, across_owners=self.merge_chat)
            out.append(Prepared(at, tuple((after, outcome) for _, after, outcome, _ in fired), tuple(messages),
                                tuple(keys)))
            start = end
        return out
