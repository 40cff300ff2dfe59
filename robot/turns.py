"""One model run at a time per member and chat, in the order their messages arrived.

A member who asks twice in a row ("明天天气怎么样？" then "那后天呢？") expects the second answer after
the first, and the second run to have read the first answer. Run side by side, the second run read a
window without the first answer, and the answers came back in whichever order they were ready. So
each message the model is likely to answer takes its place in its member's line as it arrives
(:meth:`SenderTurns.enter`, before any await), and its run waits for the runs ahead of it
(:meth:`Ticket.wait`). Different members, and the same member in other chats, still run at once.

The wait is bounded (:data:`WAIT_S`): a run stuck on a slow provider or tool delays the member's next
question that long at most, then the next one goes ahead out of order rather than not at all. Only
runs wait: a message that ends up answered otherwise (a /command, an answer to a question, a
refusal) leaves its place without waiting.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["WAIT_S", "SenderTurns", "Ticket"]

log = logging.getLogger(__name__)

WAIT_S = 60.0  #: longest a run waits for the same member's runs ahead of it


class Ticket:
    """A message's place in its member's line (:meth:`SenderTurns.enter`)."""

    def __init__(self, turns: SenderTurns, key: str, ahead: asyncio.Future[None] | None) -> None:
        self._turns, self._key, self._ahead = turns, key, ahead
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def wait(self) -> bool:
        """Wait until the runs ahead have ended (or :data:`WAIT_S` has passed); True if any was still running."""
        ahead = self._ahead
        if ahead is None or ahead.done():
            self._ahead = None
            return False
        try:  # (shielded: this wait's timeout or cancel leaves the other run be; cancelled, the place still holds it)
            await asyncio.wait_for(asyncio.shield(ahead), self._turns.wait_s)
        except TimeoutError:
            log.warning("a run of %s still going after %.0f s: the next question goes ahead", self._key.replace(
                "\n", " "), self._turns.wait_s)
        self._ahead = None
        return True

    def leave(self) -> None:
        """Give the place up (the run ended, or none is made). One that never waited holds the line for the runs
        ahead of it still: the next in line waits for those too. Idempotent."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not ahead.done():
            ahead.add_done_callback(lambda _: self._resolve())
        else:
            self._resolve()

    def _resolve(self) -> None:
        if not self._done.done():
            self._done.set_result(None)
            self._turns._left(self._key, self._done)


class SenderTurns:
    """Lines of model runs keyed by chat and member."""

    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self._tails: dict[str, asyncio.Future[None]] = {}  # each line's last place (gone once it is left)

    def enter(self, key: str) -> Ticket:
        """Take the last place in ``key``'s line (synchronous: in the order messages arrive)."""
        ticket = Ticket(self, key, self._tails.get(key))
        self._tails[key] = ticket._done
        return ticket

    def _left(self, key: str, done: asyncio.Future[None]) -> None:
        if self._tails.get(key) is done:  # the last in line left: nothing to keep for this member
            del self._tails[key]

    def __len__(self) -> int:
        return len(self._tails)
