"""The Telegram channel's state: the polling offset, group migrations and the webhook spool.

In a bot (:meth:`TelegramState.attach`, done by the channel's ``attach_state``) the offset and the
migrations live in the database's ``channel_state`` table (:mod:`robot.channels.state_store`) under
the bot's id: ``offset`` and one ``migrated:<old chat id>`` row per group that became a supergroup,
so a process that takes the bot over resumes where the last one stopped. On first use the JSON files
an older qunbot wrote (``<bot>-offset.json``, ``<bot>-migrated.json``) are imported (what the
database already holds wins) and renamed ``*.imported``. Without a database (a channel run alone)
they stay in those files, written 0600 through a temporary file and a rename.

The webhook spool stays on local disk (``<bot>-webhook/<update_id>.json``), per process by nature:
an update is spooled by the process whose 200 told Telegram it was received, fsync'ed before that
200 (Telegram never sends it again), and delivered by that process, or by its next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from robot.channels.files import write_private
from robot.channels.state_store import ChannelState

__all__ = ["TelegramState", "read_spool", "write_private"]


log = logging.getLogger(__name__)
_PLATFORM = "telegram"
_MIGRATED = "migrated:"


def read_spool(folder: Path) -> list[tuple[dict[str, Any], Path]]:
    """The updates left in ``folder`` (``<update_id>.json``), oldest first; unreadable ones are skipped."""
    found: list[tuple[int, dict[str, Any], Path]] = []
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            log.warning("telegram: unreadable spooled update %s skipped", path.name)
            continue
        if isinstance(data, dict) and path.stem.isdigit():
            found.append((int(path.stem), data, path))
    return [(data, path) for _, data, path in sorted(found, key=lambda f: f[0])]


class TelegramState:
    """A bot's offset and group migrations: in the attached database, else in files under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.store: ChannelState | None = None
        self._imported: set[str] = set()

    def attach(self, store: ChannelState) -> None:
        """Keep state in ``store`` from now on (the old files are imported on first use)."""
        self.store = store

    def _read(self, bot_id: str, name: str) -> dict[str, Any]:
        try:
            data = json.loads((self.folder / f"{bot_id}-{name}").read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    async def _db(self, bot_id: str) -> ChannelState | None:
        """The store, once this bot's old files are in it; None without one."""
        if self.store is None or bot_id in self._imported:
            return self.store
        offset = (await asyncio.to_thread(self._read, bot_id, "offset.json")).get("offset")
        migrated = await asyncio.to_thread(self._read, bot_id, "migrated.json")
        put = {_MIGRATED + str(old): str(new) for old, new in migrated.items() if isinstance(new, str | int)}
        if isinstance(offset, int) and offset > 0:
            put["offset"] = str(offset)
        if put:
            await self.store.update(_PLATFORM, bot_id, put, only_new=True, durable=True)
            for name in ("offset.json", "migrated.json"):
                path = self.folder / f"{bot_id}-{name}"
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(path.rename, path.with_name(path.name + ".imported"))
            log.warning("telegram: bot %s's offset and group migrations imported from %s into the database; "
                        "the files are renamed *.imported", bot_id, self.folder)
        self._imported.add(bot_id)
        return self.store

    async def load_offset(self, bot_id: str) -> int:
        """The next ``getUpdates`` offset (0: whatever Telegram still holds)."""
        store = await self._db(bot_id)
        if store is None:
            value: object = (await asyncio.to_thread(self._read, bot_id, "offset.json")).get("offset", 0)
        else:
            value = await store.get(_PLATFORM, bot_id, "offset") or 0
        try:
            return int(str(value))
        except ValueError:
            log.error("telegram: the stored offset %r is not a number; starting from what Telegram holds", value)
            return 0

    async def save_offset(self, bot_id: str, offset: int) -> None:
        store = await self._db(bot_id)
        if store is None:
            return await asyncio.to_thread(write_private, self.folder / f"{bot_id}-offset.json", {"offset": offset})
        await store.put(_PLATFORM, bot_id, "offset", str(offset))

    async def load_migrated(self, bot_id: str) -> dict[str, str]:
        """Old group id -> the supergroup it became."""
        store = await self._db(bot_id)
        if store is None:
            data = await asyncio.to_thread(self._read, bot_id, "migrated.json")
            return {str(old): str(new) for old, new in data.items()}
        rows = await store.items(_PLATFORM, account=bot_id, prefix=_MIGRATED)
        return {key[len(_MIGRATED):]: new for (_, key), new in rows.items()}

    async def save_migration(self, bot_id: str, old: str, new: str, everything: dict[str, str]) -> None:
        """Remember that ``old`` became ``new`` (``everything``: the whole map, for the file)."""
        store = await self._db(bot_id)
        if store is None:
            return await asyncio.to_thread(write_private, self.folder / f"{bot_id}-migrated.json", dict(everything))
        await store.put(_PLATFORM, bot_id, _MIGRATED + old, new, durable=True)
