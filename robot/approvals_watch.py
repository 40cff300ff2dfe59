"""Which chats' next message may answer a paused run (``ask_user``, a requester's "确认"), in any process.

:meth:`robot.approvals.Approvals.intercept` runs for every message, so the chat keys with such a row are
kept in memory. Processes sharing a PostgreSQL database each keep their own copy: a row another process
pauses reaches this one as a notification (:data:`robot.snapshots.ANSWERABLE`), a lost notification
connection and every expiry pass re-read the table. A chat's answer may reach any process (an account taken
over, a bridge reconnected elsewhere); one that does not know the question would pass it on as a new
request, and the question would time out.
"""

from __future__ import annotations

from robot.snapshots import ANSWERABLE, SnapshotStore
from robot.store import Engine

__all__ = ["AnswerWatch"]


class AnswerWatch:
    """The chat keys with a pending ``input`` or requester-confirmed snapshot (a superset is harmless:
    each message of these chats is looked up)."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self.chats: set[str] = set()
        self._seq = 0  # counts additions: a re-read keeps those that came after its query was sent
        self._added: dict[str, int] = {}
        self._shown = -1  # the newest re-read applied: an older one finishing late changes nothing

    def __contains__(self, chat_key: str) -> bool:
        return chat_key in self.chats

    def follow(self, db: Engine) -> None:
        """Take other processes' new rows as they are stored, and re-read after a notification gap."""
        db.subscribe(ANSWERABLE, self.add)
        db.after_gap(self.reload)

    def add(self, chat_key: str) -> None:
        """A row that ``chat_key``'s next message may answer was stored."""
        self._seq += 1
        self._added[chat_key] = self._seq
        self.chats.add(chat_key)

    async def reload(self) -> None:
        """Re-read the chats from the table (dropping answered ones), keeping what was added meanwhile."""
        mark = self._seq
        fresh = await self.store.answerable_chats()
        if mark < self._shown:
            return
        self._shown = mark
        later = {chat: seq for chat, seq in self._added.items() if seq > mark}
        self.chats, self._added = fresh | set(later), later
