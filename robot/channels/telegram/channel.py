"""The Telegram channel: Bot API updates in (long polling or webhook), ``sendMessage`` out.

Chats: private chats, groups and supergroups. A forum topic is a chat of its own, ``<chat>/<thread>``,
so its history stays apart and replies keep ``message_thread_id``. A group that became a
supergroup (``migrate_to_chat_id``) is remembered, so replies and reminders addressed to the old
id reach the new one.

Polling: a poll confirms to Telegram every update before its ``offset`` (never sent again), so a
batch is spooled to disk (fsync'ed, :mod:`.webhook`) before the next poll, and a start delivers what a
crash left there; the stored ``offset`` (:mod:`.state`) moves only once every update of a batch has
been taken by the bot (recorded), so another process polling next gets the unconfirmed rest again;
the bot drops replays. Webhook (:mod:`.webhook`): ``X-Telegram-Bot-Api-Secret-Token`` must match
``webhook_secret`` or the request gets 401; an update is spooled to disk before its 200. Once the bot
stops taking messages the poller asks no more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from robot.channels.base import (
    Capabilities,
    ChannelUnavailable,
    SendReceipt,
    SendRejected,
    batch_taken,
    transport_failure,
)
from robot.channels.state_store import ChannelState
from robot.channels.telegram.albums import Albums
from robot.channels.telegram.api import (
    ChatMigrated,
    TelegramApi,
    TelegramApiError,
    TelegramError,
    TokenRefused,
    TooManyRequests,
    utf16_len,
)
from robot.channels.telegram.convert import (
    LIMIT,
    placeholder,
    read_entities,
    sender_of,
    split_utf16,
    start_as_help,
)
from robot.channels.telegram.names import MentionNames
from robot.channels.telegram.settings import TelegramSettings
from robot.channels.telegram.state import TelegramState
from robot.channels.telegram.webhook import WebhookIntake
from robot.channels.typing_indicator import TypingIndicators
from robot.message import ChatRef, Message, OutgoingMessage

__all__ = ["TelegramChannel"]

log = logging.getLogger(__name__)
_COMMAND = re.compile(r"^[a-z0-9_]{1,32}$")


class TelegramChannel(WebhookIntake):
    """One Telegram bot (the account is its numeric id)."""

    platform = "telegram"
    account_leases = True  # getUpdates has one consumer per bot: one process polls (and sends for) it
    typing_refresh_s = 4.5  # Telegram shows a chat action for about five seconds
    typing_max_s = 600.0  # "typing" stops this long after a chat's latest run started, even if none ended

    def __init__(self, settings: TelegramSettings, data_dir: Path | str = "data",
                 *, session: aiohttp.ClientSession | None = None) -> None:
        super().__init__()
        self.settings = settings
        # One outbox part, one message (a character is 2 UTF-16 units at most): a retry doubled earlier pieces
        self.capabilities = Capabilities(max_text_len=LIMIT // 2, mentions=True, markdown=False)
        self.state_dir = settings.state_dir or Path(data_dir) / "telegram"
        self.state = TelegramState(self.state_dir)
        self._session = session
        self._own_session = session is None
        self.api: TelegramApi | None = None
        self.bot_id = ""
        self.username = ""
        self.migrated: dict[str, str] = {}
        self._poller: asyncio.Task[None] | None = None
        self._commit: asyncio.Task[bool] | None = None
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._typing = TypingIndicators("telegram")
        self._spooled: dict[str, asyncio.Task[bool]] = {}
        self.names = MentionNames(self._target)
        self._refused_at: float | None = None  # when the owner was told that Telegram refuses the token
        self._stopping = asyncio.Event()
        self.albums = Albums(self._deliver_logged)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._stopping.clear()
        self.api = TelegramApi(self._session, self.settings.api_base, self.settings.token.get_secret_value(),
                               timeout_s=self.settings.request_timeout)
        me = await self.api.call("getMe")
        self.bot_id, self.username = str(me["id"]), str(me.get("username") or "")
        self.migrated = await self.state.load_migrated(self.bot_id)
        await self._replay_spool()  # also after a switch to polling: Telegram will not send these again
        if self.settings.mode == "webhook":
            await self._start_webhook()
        else:
            await self.api.call("deleteWebhook", {"drop_pending_updates": False})
        await self.serve_account(self.bot_id, self._poll if self.settings.mode == "polling" else None)

    def default_account(self) -> str | None:
        return self.bot_id or None

    async def stop(self) -> None:
        self._stopping.set()
        await self.stop_serving()
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        await self._typing.close()
        await self.finish_deliveries(grace_s=2.0)
        if self._commit is not None:
            await asyncio.gather(self._commit, return_exceptions=True)
            self._commit = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def location(self) -> str | None:
        return self._url or (f"telegram @{self.username}" if self.username else None)

    def attach_state(self, store: ChannelState) -> None:
        self.state.attach(store)

    # --- receiving ----------------------------------------------------------------------------
    async def _poll(self) -> None:
        assert self.api is not None
        offset: int | None = None
        failures, pause = 0, 0.0
        while not self._stopping.is_set() and self.taking:  # (a poll would confirm what the bot no longer takes)
            if pause:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause)
            asked, pause = time.monotonic(), 0.0
            try:
                if offset is None:  # inside the guard: a database blip delays the poller, never ends it
                    offset = await self.state.load_offset(self.bot_id)
                updates = await self.api.call(
                    "getUpdates", {"offset": offset, "timeout": self.settings.poll_timeout_s,
                                   "allowed_updates": ["message"]},
                    timeout_s=self.settings.poll_timeout_s + self.settings.request_timeout)
            except Exception as exc:  # TelegramError, or a bug: the poller must not die silently
                if not isinstance(exc, TelegramError):
                    log.exception("telegram: unexpected error while polling")
                failures += 1
                delay = min(self.settings.backoff_max_s, self.settings.retry_delay_s * 2 ** min(failures - 1, 10))
                if isinstance(exc, TooManyRequests):
                    delay = max(delay, exc.retry_after)
                if isinstance(exc, TokenRefused):
                    self._refused(exc)
                log.warning("telegram: getUpdates failed (%s); retrying in %.0f s", exc, delay)
                pause = delay
                continue
            failures = 0
            self._token_works(asked)
            if not isinstance(updates, list) or not updates:  # answered empty at once (timeout 0, a proxy):
                pause = self.settings.retry_delay_s if time.monotonic() - asked < 1 else 0.0  # no busy loop
                continue
            ids = [u["update_id"] for u in updates if isinstance(u, dict) and isinstance(u.get("update_id"), int)]
            if not ids:
                if time.monotonic() - asked < 1:  # nothing usable, answered at once: no busy loop either
                    pause = self.settings.retry_delay_s
                continue
            # The next poll confirms this batch to Telegram, which never sends it again: ours on disk first.
            batch = await self._take_batch([u for u in updates if isinstance(u, dict)])
            if batch is None:
                return  # not on disk and not taken (the bot stops): left unconfirmed, Telegram sends it again
            offset = max(ids) + 1
            self._commit = asyncio.create_task(self._save_offset(self._commit, batch, offset))

    def _refused(self, exc: TokenRefused) -> None:
        """Tell the owner, once until a call works again, that only a new token helps."""
        if self._refused_at is None:
            self._refused_at = time.monotonic()
            log.error("telegram: %s: the bot token is wrong or was revoked; messages wait. Put the token "
                      "@BotFather shows into [channels.telegram] token and restart qunbot", exc)

    def _token_works(self, asked: float) -> None:
        """A call made at ``asked`` worked: a refusal told before it is over (not one told while it was out)."""
        if self._refused_at is not None and asked > self._refused_at:
            self._refused_at = None

    async def _save_offset(self, previous: asyncio.Task[bool] | None, batch: list[asyncio.Task[bool]], at: int) -> bool:
        """Save ``at`` once this batch (and every earlier one) was taken by the bot; whether it was."""
        if not await batch_taken(previous, batch):  # the process polling next (maybe another) gets it again
            return False
        try:
            await self.state.save_offset(self.bot_id, at)
        except OSError:
            log.exception("telegram: could not save the update offset")
        return True

    def _accept(self, update: dict[str, Any]) -> asyncio.Task[bool] | None:
        """Hand one update to the bot in the background; returns the delivery task (False: not taken)."""
        try:
            message = self.to_message(update)
        except Exception as exc:  # any shape the API (or a forged webhook) sends must not stop the reader
            log.warning("telegram: skipped malformed update %s (%s)", update.get("update_id"), type(exc).__name__)
            return None
        if message is None:
            return None
        if (group := update["message"].get("media_group_id")) is not None:  # a part of an album: one message
            task = self.albums.add(f"{message.chat.key}/{group}", message, placeholder(update["message"]))
        else:
            task = asyncio.create_task(self._deliver_logged(message), name=f"telegram-deliver-{message.message_id}")
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)
        return task

    def to_message(self, update: dict[str, Any]) -> Message | None:
        """A Bot API update as a :class:`Message`, or None for what the bot does not read."""
        msg = update.get("message")  # (an edit kept the original's id: it was dropped as a redelivery; not asked for)
        if not isinstance(msg, dict):
            return None
        chat = msg["chat"]
        chat_type, chat_id = chat.get("type"), str(chat["id"])
        if chat_type not in ("private", "group", "supergroup"):
            return None
        if msg.get("migrate_to_chat_id") is not None:
            self._remember_migration(chat_id, str(msg["migrate_to_chat_id"]))
            return None
        if msg.get("migrate_from_chat_id") is not None:
            self._remember_migration(str(msg["migrate_from_chat_id"]), chat_id)
            return None
        sender = msg.get("from") or {}
        if not sender:
            return None
        thread = msg.get("message_thread_id") if msg.get("is_topic_message") else None
        key_id = f"{chat_id}/{thread}" if thread is not None else chat_id
        text = msg.get("text") if isinstance(msg.get("text"), str) else msg.get("caption") or ""
        entities = msg.get("entities") or msg.get("caption_entities") or []
        text, mentions, mentions_bot = read_entities(str(text), entities, self.username, self.bot_id)
        marker = placeholder(msg)  # (a caption comes after its photo's marker; a /command caption stays one)
        text = (f"{text} {marker}" if text.startswith("/") else f"{marker} {text}") if marker and text else marker or text
        if chat_type == "private" or mentions_bot:
            text = start_as_help(text)
        reply = msg.get("reply_to_message") or {}
        # In a forum every message "replies" to the topic's first message; that is not a reply.
        if reply and thread is not None and reply.get("message_id") == thread:
            reply = {}
        who = sender_of(msg, chat_id)
        if who.user_id.isdigit():
            self.names.remember(int(who.user_id), who.name)
        return Message(
            chat=ChatRef(platform=self.platform, chat_id=key_id, kind="private" if chat_type == "private" else "group",
                         account=self.bot_id),
            sender=who,
            message_id=f"{chat_id}:{msg['message_id']}",  # ids are per chat in Telegram
            text=text, timestamp=datetime.fromtimestamp(int(msg["date"]), UTC), mentions=mentions,
            mentions_bot=mentions_bot,
            reply_to=f"{chat_id}:{reply['message_id']}" if reply.get("message_id") is not None else None,
            reply_to_bot=str((reply.get("from") or {}).get("id")) == self.bot_id,
            from_bot=bool(sender.get("is_bot")) and str(sender.get("id")) == self.bot_id,
            raw=update,
        )

    def _remember_migration(self, old: str, new: str) -> asyncio.Task[None] | None:
        """Redirect sends from ``old`` to ``new`` and have the bot move the chat's data (once)."""
        if self.migrated.get(old) == new:
            return None
        self.migrated[old] = new
        log.warning("telegram: group %s became supergroup %s; its history, replies and reminders follow it",
                    old, new)
        task = asyncio.create_task(self._moved(old, new))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)
        return task

    async def _moved(self, old: str, new: str) -> None:
        try:
            await self.state.save_migration(self.bot_id, old, new, self.migrated)
        except OSError:
            log.exception("telegram: could not save the group migration")
        await self.chat_moved(ChatRef(platform=self.platform, chat_id=old, kind="group", account=self.bot_id),
                              ChatRef(platform=self.platform, chat_id=new, kind="group", account=self.bot_id))

    # --- sending ------------------------------------------------------------------------------
    def _target(self, chat: ChatRef) -> tuple[str, int | None]:
        base, _, thread = chat.chat_id.partition("/")
        base = self.migrated.get(base, base)
        return base, int(thread) if thread else None

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        if self.api is None:
            raise ChannelUnavailable("telegram channel is not started")
        if message.chat.account and self.bot_id and message.chat.account != self.bot_id:
            raise SendRejected(f"telegram bot {message.chat.account} is not this bot ({self.bot_id})")
        # A message clears the chat's "typing": back after it while other runs there go on.
        async with self._typing.paused(message.chat.key):
            prefix, entities = await self.names.prefix(self.api, message)
            receipt = SendReceipt()
            for i, part in enumerate(split_utf16(prefix + message.text)):
                receipt = await self._send_part(message, part, [e for e in entities if i == 0 and
                                                                e["offset"] + e["length"] <= utf16_len(part)])
        return receipt

    async def _send_part(self, message: OutgoingMessage, text: str, entities: list[dict[str, Any]]) -> SendReceipt:
        assert self.api is not None
        for _ in range(2):  # a second try after learning of a migration
            chat_id, thread = self._target(message.chat)
            payload: dict[str, Any] = {"chat_id": chat_id, "text": text}
            if entities:
                payload["entities"] = entities
            if thread is not None:
                payload["message_thread_id"] = thread
            if message.reply_to:  # a message of this chat only (a migrated group's numbers are another's)
                where, _, reply_id = message.reply_to.rpartition(":")
                if reply_id.isdigit() and where == str(chat_id):
                    payload["reply_parameters"] = {"message_id": int(reply_id), "allow_sending_without_reply": True}
            try:
                asked = time.monotonic()
                result = await self.api.call("sendMessage", payload)
            except ChatMigrated as exc:
                moving = self._remember_migration(chat_id, str(exc.new_chat_id))
                if moving is not None:
                    await moving
                continue
            except TooManyRequests as exc:
                raise ChannelUnavailable(f"telegram flood control: retry after {exc.retry_after:g} s",
                                         retry_after_s=exc.retry_after) from None
            except TokenRefused as exc:  # no message can go: they wait for the fixed token, none is failed
                self._refused(exc)
                raise ChannelUnavailable(f"telegram refuses the bot token ({exc})") from None
            except TelegramApiError as exc:
                raise SendRejected(str(exc)) from None
            except TelegramError as exc:
                raise transport_failure(str(exc), exc) from None
            self._token_works(asked)
            mid = result.get("message_id") if isinstance(result, dict) else None
            return SendReceipt(platform_message_id=f"{chat_id}:{mid}" if mid is not None else None)
        raise SendRejected(f"telegram chat {message.chat.chat_id} keeps migrating")

    async def publish_commands(self, commands: Sequence[tuple[str, str]]) -> None:
        if not self.settings.set_commands or self.api is None:
            return
        menu = [{"command": name, "description": (desc or name)[:256]}
                for name, desc in commands if _COMMAND.fullmatch(name)][:100]
        try:
            await self.api.call("setMyCommands", {"commands": menu})
        except TelegramError as exc:
            log.warning("telegram: setMyCommands failed: %s", exc)

    # --- typing -------------------------------------------------------------------------------
    async def typing(self, chat: ChatRef, active: bool) -> None:
        """Show "typing" while any run in the chat goes on (runs counted: the last one's end clears it)."""
        if not active:
            await self._typing.end(chat.key)
        elif self.settings.typing and self.api is not None and not self._stopping.is_set():
            self._typing.begin(chat.key, functools.partial(self._show_typing, chat), every=self.typing_refresh_s,
                               max_s=self.typing_max_s)

    async def _show_typing(self, chat: ChatRef) -> bool:
        assert self.api is not None
        chat_id, thread = self._target(chat)
        payload: dict[str, Any] = {"chat_id": chat_id, "action": "typing"}
        if thread is not None:
            payload["message_thread_id"] = thread
        await self.api.call("sendChatAction", payload)
        return True
