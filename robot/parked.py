"""Messages the bot turned away as it stopped (:class:`robot.NotTaken`), or whose handling the stop cut
short (:mod:`robot.stopping`), kept to be answered later.

Some platforms never send a message again once their channel took it: OneBot's sockets, a WeCom
callback answered "success", the web playground. What the stopping bot no longer takes, or no longer
answers, is kept here (not one whose reply is queued) and answered at the next start, or by another
process still running on the same database (every :attr:`ParkedMessages.every_s`). A channel whose
platform does redeliver (a poll cursor, a callback's retry) leaves the message unacknowledged as
well: the pipeline's dedupe drops the second copy. A row lives until it was handled (a day at most,
then dropped with a warning), and ``/forget me`` clears the person's (:meth:`ParkedMessages.forget`,
a :class:`~robot.privacy.Forgetter` of the bot's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from robot.channels.base import NotTaken
from robot.message import Message
from robot.privacy import ForgetRequest
from robot.storage import Engine, Tx, iso

__all__ = ["KEEP", "ParkedMessages"]

log = logging.getLogger(__name__)
#: How long a turned-away message waits for a start: older, it is stale and dropped.
KEEP = timedelta(days=1)
_SCHEMA = ("CREATE TABLE IF NOT EXISTS parked_messages (platform TEXT NOT NULL, message_id TEXT NOT NULL, "
           "chat TEXT NOT NULL, user_id TEXT NOT NULL, body TEXT NOT NULL, parked_at TEXT NOT NULL, "
           "PRIMARY KEY (platform, message_id))")


class ParkedMessages:
    """The ``parked_messages`` table: :meth:`park` as the bot stops, :meth:`replay` as it starts."""

    def __init__(self, db: Engine, clock: Callable[[], datetime]) -> None:
        self.db, self.clock = db, clock
        self.every_s = 30.0  #: how often a running process looks for messages another one kept
        db.migrate("parked", [_SCHEMA])

    async def park(self, message: Message) -> bool:
        """Keep ``message`` for the next start (its ``raw`` payload is not kept); False when the database refused."""
        return await self._park(message, unless_handled=False)

    async def park_unanswered(self, message: Message) -> bool:
        """:meth:`park` a message the stop cut short, unless the pipeline marked it handled (the unit
        queueing its reply does): it has its answer. False when the database refused it."""
        return await self._park(message, unless_handled=True)

    async def _park(self, message: Message, *, unless_handled: bool) -> bool:
        body = message.model_copy(update={"raw": None}).model_dump_json()
        ident = [message.platform, message.message_id]
        row = [*ident, message.chat.key, message.sender.user_id, body, iso(self.clock())]

        def keep(db: Tx) -> None:
            # (were the mark committed just after this, the replay's dedupe drops the copy: answered once)
            if unless_handled and db.execute("SELECT 1 FROM seen WHERE platform = ? AND message_id = ? "
                                             "AND handled = 1", ident).fetchone() is not None:
                return
            db.execute("INSERT INTO parked_messages (platform, message_id, chat, user_id, body, parked_at) "
                       "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (platform, message_id) DO NOTHING", row)

        try:
            await self.db.transaction(keep, urgent=True)
        except Exception:  # (a database going away as the bot stops): the platform's redelivery, if any, is left
            log.exception("%s message %s: could not keep it for the next start", message.platform, message.message_id)
            return False
        return True

    async def forget(self, request: ForgetRequest) -> int:
        """``/forget me``: the person's messages kept, in the chats the request covers."""
        def work(db: Tx) -> int:
            rows = db.execute("SELECT chat FROM parked_messages WHERE platform = ? AND user_id = ?",
                              [request.platform, request.user_id]).fetchall()
            chats = [str(r[0]) for r in rows if request.covers(str(r[0]))]
            return sum(int(db.execute("DELETE FROM parked_messages WHERE chat = ? AND user_id = ?",
                                      [chat, request.user_id]).rowcount) for chat in dict.fromkeys(chats))
        return await self.db.run(work)

    async def keep_replaying(self, handle: Callable[[Message], Awaitable[None]]) -> None:
        """:meth:`replay` now and every :attr:`every_s`: with several processes on one database, what one
        kept as it stopped is answered by another still running (a rolling restart, a scale-down),
        not only by a process starting later. Two taking the same row answer it once (the pipeline's
        dedupe)."""
        while True:
            await self.replay(handle)
            await asyncio.sleep(self.every_s)

    async def replay(self, handle: Callable[[Message], Awaitable[None]]) -> int:
        """Hand every kept message to ``handle`` (the bot's sink), then forget it; returns how many were handed."""
        cutoff = iso(self.clock() - KEEP)

        def take(db: Tx) -> tuple[int, list[tuple[str, str, str]]]:
            stale = int(db.execute("DELETE FROM parked_messages WHERE parked_at < ?", [cutoff]).rowcount)
            return stale, [(str(r[0]), str(r[1]), str(r[2])) for r in db.execute(
                "SELECT platform, message_id, body FROM parked_messages ORDER BY parked_at").fetchall()]

        try:
            stale, rows = await self.db.run(take)
        except Exception:  # (a database refusing work): kept for the next pass
            log.exception("could not read the messages kept from a stop")
            return 0
        if stale:
            log.warning("%d message(s) kept from a stop waited longer than %s and are dropped unanswered", stale, KEEP)
        messages: list[Message] = []
        for platform, message_id, body in rows:
            try:
                messages.append(Message.model_validate_json(body))
            except ValueError:  # one this version cannot read (another's, edited) holds up none of the others
                log.warning("%s message %s kept from the last stop cannot be read; it is left for a day",
                            platform, message_id)
        if messages:
            log.warning("handling %d message(s) that came as the bot stopped last time", len(messages))

        async def one(message: Message) -> bool:
            try:
                await handle(message)
            except NotTaken:  # stopping again: kept for the start after
                return False
            try:  # (left, the next start hands it over again: the pipeline's dedupe drops it)
                await self.db.run(lambda db: db.execute(
                    "DELETE FROM parked_messages WHERE platform = ? AND message_id = ?",
                    [message.platform, message.message_id]))
            except Exception:
                log.exception("%s message %s: could not forget it as handled", message.platform, message.message_id)
            return True

        return sum(await asyncio.gather(*(one(m) for m in messages)))
