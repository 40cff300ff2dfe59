"""A fake Telegram Bot API server on loopback, for tests and benches.

It answers as https://core.telegram.org/bots/api describes: ``{"ok": true, "result": ...}`` or
``{"ok": false, "error_code", "description", "parameters"}``; ``getUpdates`` confirms every update
below ``offset`` and long-polls up to ``timeout``; ``sendMessage`` checks the text (1-4096 UTF-16
units), ``entities`` (inside the text, a ``text_mention`` names a user id), ``reply_parameters`` and
``message_thread_id``; ``getChatMember`` knows the users of the messages it queued; a migrated group answers 400 with
``migrate_to_chat_id``; ``flood(n)`` makes the next sends answer 429 with ``retry_after``.
A request the real API would refuse for its shape is answered 400 and listed in ``errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from function_calls.testing.loopback import LoopbackServer

__all__ = ["FakeBotAPI", "Sent"]

_COMMAND = re.compile(r"^[a-z0-9_]{1,32}$")


@dataclass
class Sent:
    """One message the fake accepted."""

    chat_id: int
    text: str
    message_id: int
    thread_id: int | None = None
    reply_to: int | None = None
    entities: list[dict[str, Any]] = field(default_factory=list)
    at: float = field(default_factory=time.time)  # when it arrived (UTC epoch seconds)


class FakeBotAPI(LoopbackServer):
    """``async with FakeBotAPI("123:abc") as api:``; ``api.url`` is the ``api_base`` to configure."""

    def __init__(self, token: str = "123456:TEST-token", *, username: str = "qun_test_bot",
                 max_hold_s: float = 0.3) -> None:
        super().__init__()
        self.token = token
        self.bot = {"id": int(token.split(":")[0]), "is_bot": True, "first_name": "Qun", "username": username}
        self.max_hold_s = max_hold_s
        self.updates: list[dict[str, Any]] = []
        self.offsets: list[int] = []
        self.sent: list[Sent] = []
        self.actions: list[tuple[int, str]] = []
        self.commands: list[dict[str, str]] | None = None
        self.webhook: dict[str, Any] | None = None
        self.migrated: dict[int, int] = {}
        self.errors: list[str] = []
        self.users: dict[int, dict[str, Any]] = {}  # who wrote the queued messages: getChatMember's answers
        self.calls: list[str] = []
        self._flood: list[int] = []
        self.fail_sends: list[int] = []  # HTTP statuses (5xx) for the next sendMessage calls
        self._ids = itertools.count(1)
        self._message_ids = itertools.count(1000)
        self._wake = asyncio.Event()

    # --- scripting --------------------------------------------------------------------------
    def flood(self, *retry_after: int) -> None:
        """The next ``len(retry_after)`` sends answer 429 with these waits."""
        self._flood.extend(retry_after)

    def message(self, chat: dict[str, Any], user_id: int, text: str = "", *, first_name: str = "Alice",
                entities: list[dict[str, Any]] | None = None, reply_to: dict[str, Any] | None = None,
                thread: int | None = None, **extra: Any) -> dict[str, Any]:
        """Queue an update with a new message; returns the update."""
        self.users[user_id] = {"id": user_id, "is_bot": False, "first_name": first_name}
        msg: dict[str, Any] = {"message_id": next(self._message_ids), "date": int(time.time()), "chat": chat,
                               "from": dict(self.users[user_id]), **extra}
        if text:
            msg["text"] = text
        if entities:
            msg["entities"] = entities
        if reply_to is not None:
            msg["reply_to_message"] = reply_to
        if thread is not None:
            msg["message_thread_id"] = thread
            msg["is_topic_message"] = True
        return self.push({"message": msg})

    def push(self, update: dict[str, Any]) -> dict[str, Any]:
        update = {"update_id": next(self._ids), **update}
        self.updates.append(update)
        self._wake.set()
        return update

    def bot_message(self, chat: dict[str, Any], text: str) -> dict[str, Any]:
        """A message object as if the bot had sent it (for replies to the bot)."""
        return {"message_id": next(self._message_ids), "date": int(time.time()), "chat": chat,
                "from": dict(self.bot), "text": text}

    # --- server -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The Bot API root to give the channel (``api_base``)."""
        return self.root_url

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/bot{token}/{method}", self._dispatch)

    async def stop(self) -> None:
        self._wake.set()  # long polls in flight return now
        await super().stop()

    @staticmethod
    def _ok(result: Any) -> web.Response:
        return web.json_response({"ok": True, "result": result})

    def _fail(self, code: int, description: str, parameters: dict[str, Any] | None = None,
              *, shape: bool = False) -> web.Response:
        if shape:
            self.errors.append(description)
        body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
        if parameters:
            body["parameters"] = parameters
        return web.json_response(body, status=code)

    async def _dispatch(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return self._fail(401, "Unauthorized")
        method = request.match_info["method"].lower()
        self.calls.append(method)
        try:
            body = json.loads(await request.text() or "{}")
        except ValueError:
            return self._fail(400, "Bad Request: can't parse JSON", shape=True)
        if not isinstance(body, dict):
            return self._fail(400, "Bad Request: body must be an object", shape=True)
        handler = {"getme": self._get_me, "getupdates": self._get_updates, "sendmessage": self._send_message,
                   "setmycommands": self._set_my_commands, "sendchataction": self._send_chat_action, "getchatmember": self._get_chat_member,
                   "setwebhook": self._set_webhook, "deletewebhook": self._delete_webhook}.get(method)
        if handler is None:
            return self._fail(404, "Not Found: method not found", shape=True)
        return await handler(body)

    async def _get_me(self, body: dict[str, Any]) -> web.Response:
        return self._ok(self.bot)

    async def _get_updates(self, body: dict[str, Any]) -> web.Response:
        if self.webhook is not None:
            return self._fail(409, "Conflict: can't use getUpdates method while webhook is active")
        offset, timeout = body.get("offset", 0), body.get("timeout", 0)
        if not isinstance(offset, int) or not isinstance(timeout, int) or timeout < 0:
            return self._fail(400, "Bad Request: offset and timeout must be integers", shape=True)
        self.offsets.append(offset)
        self.updates = [u for u in self.updates if u["update_id"] >= offset]  # confirmed ones are gone
        if not self.updates and timeout:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(timeout, self.max_hold_s))
        return self._ok([u for u in self.updates if u["update_id"] >= offset][:100])

    async def _send_message(self, body: dict[str, Any]) -> web.Response:
        if self.fail_sends:
            return self._fail(self.fail_sends.pop(0), "Internal Server Error")
        chat_id, text = body.get("chat_id"), body.get("text")
        try:
            chat = int(chat_id)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return self._fail(400, "Bad Request: chat not found", shape=True)
        if not isinstance(text, str) or not text.strip():
            return self._fail(400, "Bad Request: message text is empty", shape=True)
        if len(text.encode("utf-16-le")) // 2 > 4096:
            return self._fail(400, "Bad Request: message is too long", shape=True)
        thread = body.get("message_thread_id")
        if thread is not None and not isinstance(thread, int):
            return self._fail(400, "Bad Request: message_thread_id must be an integer", shape=True)
        reply = body.get("reply_parameters")
        if reply is not None and not (isinstance(reply, dict) and isinstance(reply.get("message_id"), int)):
            return self._fail(400, "Bad Request: invalid reply_parameters", shape=True)
        entities = body.get("entities") or []
        units = len(text.encode("utf-16-le")) // 2
        if not isinstance(entities, list) or not all(
                isinstance(e, dict) and isinstance(e.get("offset"), int) and isinstance(e.get("length"), int)
                and e["offset"] >= 0 and e["length"] > 0 and e["offset"] + e["length"] <= units
                and (e.get("type") != "text_mention" or isinstance((e.get("user") or {}).get("id"), int))
                for e in entities):
            return self._fail(400, "Bad Request: can't parse entities", shape=True)
        if chat in self.migrated:
            return self._fail(400, "Bad Request: group chat was upgraded to a supergroup chat",
                              {"migrate_to_chat_id": self.migrated[chat]})
        if self._flood:
            wait = self._flood.pop(0)
            return self._fail(429, f"Too Many Requests: retry after {wait}", {"retry_after": wait})
        mid = next(self._message_ids)
        self.sent.append(Sent(chat, text, mid, thread, reply["message_id"] if reply else None, entities))
        return self._ok({"message_id": mid, "date": int(time.time()), "chat": {"id": chat},
                         "from": self.bot, "text": text})

    async def _set_my_commands(self, body: dict[str, Any]) -> web.Response:
        commands = body.get("commands")
        if not isinstance(commands, list) or len(commands) > 100 or not all(
                isinstance(c, dict) and _COMMAND.fullmatch(str(c.get("command", "")))
                and 1 <= len(str(c.get("description", ""))) <= 256 for c in commands):
            return self._fail(400, "Bad Request: BOT_COMMAND_INVALID", shape=True)
        self.commands = commands
        return self._ok(True)

    async def _send_chat_action(self, body: dict[str, Any]) -> web.Response:
        if body.get("action") not in ("typing", "upload_photo", "record_voice", "upload_document"):
            return self._fail(400, "Bad Request: wrong parameter action in request", shape=True)
        self.actions.append((int(body["chat_id"]), str(body["action"])))
        return self._ok(True)

    async def _get_chat_member(self, body: dict[str, Any]) -> web.Response:
        user = self.users.get(body.get("user_id"))  # type: ignore[arg-type]
        if user is None:
            return self._fail(400, "Bad Request: user not found")
        return self._ok({"status": "member", "user": user})

    async def _set_webhook(self, body: dict[str, Any]) -> web.Response:
        if not isinstance(body.get("url"), str):
            return self._fail(400, "Bad Request: bad webhook url", shape=True)
        self.webhook = body
        return self._ok(True)

    async def _delete_webhook(self, body: dict[str, Any]) -> web.Response:
        self.webhook = None
        return self._ok(True)
