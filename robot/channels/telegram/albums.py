"""An album (photos or videos sent together) as one message, not one per part.

Telegram sends each part of an album as its own update, sharing a ``media_group_id``; only one part
(usually the first) carries the caption. Handed over one by one, a private chat's album of three
photos got three answers, and a group's "@bot 这几张图里有什么？" was asked about one photo while the
others arrived as separate lines. So parts are gathered until none has come for :data:`QUIET_S` (or
:data:`GATHER_S` after the first), then delivered as one message: the parts' markers together with
the caption ("[图片] [图片] [图片] 这几张图里有什么？"), under the first part's id (a redelivered album
is a duplicate of the one taken). Every part's update is acknowledged with the album's delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from robot.message import Message

__all__ = ["GATHER_S", "QUIET_S", "Albums", "merged"]

QUIET_S = 0.8  #: an album is complete once no part has come for this long (Telegram sends them within ms)
GATHER_S = 3.0  #: and delivered this long after its first part at the latest


def _order(message: Message) -> tuple[int, str]:
    number = message.message_id.rpartition(":")[2]  # ("<chat>:<id>": ids grow within a chat)
    return (int(number), "") if number.isdigit() else (2 ** 63, message.message_id)


def _without_marker(text: str, marker: str) -> str:
    """A part's caption alone (:meth:`TelegramChannel.to_message` put its marker before it, or after a /command)."""
    if marker and text.startswith(marker + " "):
        return text[len(marker) + 1:]
    if marker and text.endswith(" " + marker):
        return text[:-len(marker) - 1]
    return text


def merged(parts: list[Message], markers: list[str]) -> Message:
    """One message for an album's ``parts`` (``markers``: each part's marker, "[图片]"; "" for none)."""
    ordered = sorted(zip(parts, markers, strict=True), key=lambda pm: _order(pm[0]))
    first = ordered[0][0]
    captioned = next((p for p, m in ordered if p.text.strip() not in ("", m)), None)
    caption = "" if captioned is None else _without_marker(captioned.text, markers[parts.index(captioned)])
    shown = " ".join(m for _, m in ordered if m)  # every part's marker, in the album's order
    text = f"{caption} {shown}" if caption.startswith("/") else f"{shown} {caption}"
    text = text.strip()
    mentions = tuple(dict.fromkeys(u for p, _ in ordered for u in p.mentions))
    reply = next((p for p, _ in ordered if p.reply_to), None)
    return first.model_copy(update={
        "text": text, "mentions": mentions, "mentions_bot": any(p.mentions_bot for p, _ in ordered),
        "reply_to": reply.reply_to if reply else None, "reply_to_bot": bool(reply and reply.reply_to_bot)})


class _Album:
    def __init__(self) -> None:
        self.parts: list[Message] = []
        self.markers: list[str] = []
        self.came = asyncio.Event()
        self.task: asyncio.Task[bool] | None = None


class Albums:
    """Albums being gathered, keyed by chat and ``media_group_id``; ``deliver`` hands a message to the bot
    (True: taken)."""

    def __init__(self, deliver: Callable[[Message], Awaitable[bool]], quiet_s: float = QUIET_S,
                 gather_s: float = GATHER_S) -> None:
        self._deliver, self.quiet_s, self.gather_s = deliver, quiet_s, gather_s
        self._open: dict[str, _Album] = {}

    def add(self, key: str, message: Message, marker: str) -> asyncio.Task[bool]:
        """Add a part; returns the album's delivery (shared by its parts). A part already in is ignored."""
        album = self._open.get(key)
        if album is None:
            album = self._open[key] = _Album()
            album.task = asyncio.create_task(self._gather(key, album), name=f"telegram-album-{message.message_id}")
        if all(p.message_id != message.message_id for p in album.parts):  # (a spool replay meeting a poll)
            album.parts.append(message)
            album.markers.append(marker)
            album.came.set()
        assert album.task is not None
        return album.task

    async def _gather(self, key: str, album: _Album) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.gather_s
        try:
            while (left := deadline - loop.time()) > 0:
                album.came.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(album.came.wait(), min(self.quiet_s, left))
                    continue
                break
        finally:
            self._open.pop(key, None)  # (parts coming later start an album of their own)
        return await self._deliver(merged(album.parts, album.markers))
