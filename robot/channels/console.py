"""The console channel: a REPL on stdin/stdout, as a private chat or a simulated group.

In group mode (``qunbot chat --group``) a line ``name: text`` speaks as that member (a new
name joins the group), and plain lines speak as the current member; ``@<bot name>`` addresses
the bot. Reading stdin happens in a worker thread, so the event loop never blocks on input.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

from robot.channels.base import Capabilities, Channel, SendReceipt
from robot.message import ChatRef, Message, OutgoingMessage, Sender

__all__ = ["ConsoleChannel"]


class ConsoleChannel(Channel):
    """A terminal chat with the bot."""

    platform = "console"
    capabilities = Capabilities(max_text_len=8000, streaming=True)

    def __init__(self, *, bot_name: str = "qunbot", group: bool = False, user: str = "me",
                 stdin: TextIO | None = None, stdout: TextIO | None = None,
                 on_eof: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.bot_name = bot_name
        self.group = group
        self.user = user
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.on_eof = on_eof
        self._reader: asyncio.Task[None] | None = None
        self._streaming: dict[str, str] = {}
        self._names: dict[str, str] = {user: user}

    @property
    def chat(self) -> ChatRef:
        if self.group:
            return ChatRef(platform=self.platform, chat_id="console-group", kind="group")
        return ChatRef(platform=self.platform, chat_id=self.user, kind="private")

    def _write(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    async def start(self) -> None:
        mode = "群聊模式：用「名字: 内容」切换发言人，@" + self.bot_name + " 呼叫机器人" if self.group else "私聊模式"
        self._write(f"qunbot console ({mode}); /help 查看命令，Ctrl-D 退出。\n")
        self._reader = asyncio.create_task(self._read_loop(), name="console-reader")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None

    def parse_line(self, line: str) -> Message | None:
        """One typed line -> a message (None for an empty line)."""
        text = line.strip()
        if not text:
            return None
        speaker = self.user
        if self.group:
            head, sep, rest = text.partition(":")
            if not sep:
                head, sep, rest = text.partition("：")
            if sep and head and " " not in head.strip() and not head.startswith(("/", "@")):
                speaker, text = head.strip(), rest.strip()
                self.user = speaker
                self._names.setdefault(speaker, speaker)
        mention = f"@{self.bot_name}"
        at_bot = self.group and mention in text
        if at_bot:
            text = text.replace(mention, " ").strip()
        return Message(chat=self.chat, sender=Sender(user_id=speaker, name=speaker), message_id=uuid.uuid4().hex,
                       text=text, timestamp=datetime.now(UTC), mentions_bot=at_bot)

    async def _read_loop(self) -> None:
        while True:
            line = await asyncio.to_thread(self.stdin.readline)
            if line == "":
                if self.on_eof is not None:
                    self.on_eof()
                return
            message = self.parse_line(line)
            if message is not None:
                await self.deliver(message)

    async def stream_delta(self, chat: ChatRef, run_id: str, delta: str) -> None:
        if run_id not in self._streaming:
            self._streaming[run_id] = ""
            self._write(f"{self.bot_name} ▸ ")
        self._streaming[run_id] += delta
        self._write(delta)

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        at = "".join(f"@{self._names.get(u, u)} " for u in message.mention)
        streamed = self._streaming.pop(message.reply_to, None) if message.reply_to else None
        if streamed is not None:
            self._write("\n")
            if streamed.strip() == message.text.strip():
                return SendReceipt(platform_message_id=message.key)  # already on screen
        self._write(f"{self.bot_name} ▸ {at}{message.text}\n")
        return SendReceipt(platform_message_id=message.key)
