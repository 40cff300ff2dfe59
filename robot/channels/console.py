"""The console channel: a REPL on stdin/stdout, as a private chat or a simulated group.

In group mode (``qunbot chat --group``) a line ``name: text`` speaks as that member (a new
name joins the group; ``12:30 …``, ``https://…`` and ``note:x`` name nobody), and plain lines
speak as the current member; ``@<bot name>`` or ``<bot name>: text`` addresses the bot (the
bot's name is never taken as a member's). With a terminal on both ends, an input prompt names the speaker and is redrawn below each reply. Reading stdin happens in a daemon thread, so the event loop never blocks on input and
a read still waiting at shutdown does not keep the process alive. A line is answered in a task of its own
(the next line waits for it): a stop gives it :attr:`ConsoleChannel.stop_grace_s` to finish, then keeps it
for the next start (:attr:`ConsoleChannel.park`), since no platform sends it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TextIO

from robot.channels.base import Capabilities, Channel, SendReceipt, cut_mention
from robot.message import ChatRef, Message, OutgoingMessage, Sender

__all__ = ["ConsoleChannel"]

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 and C1 but tab and newline
_PART = re.compile(r"#\d+$")  # the outbox's key of one part of a reply it split (robot.outbox)


class ConsoleChannel(Channel):
    """A terminal chat with the bot."""

    platform = "console"
    one_process = True  # its terminal is this process's
    capabilities = Capabilities(max_text_len=8000, streaming=True)

    def __init__(self, *, bot_name: str = "qunbot", group: bool = False, user: str = "me",
                 stdin: TextIO | None = None, stdout: TextIO | None = None,
                 on_eof: Callable[[], None] | None = None, prompt: bool | None = None) -> None:
        super().__init__()
        self.bot_name = bot_name
        self.group = group
        self.user = user
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.on_eof = on_eof
        self._reader: asyncio.Task[None] | None = None
        #: Typed lines, each with a notice to show first (a line that was not valid text), or None.
        self._lines: asyncio.Queue[tuple[str, str | None]] | None = None
        self._answering: dict[asyncio.Task[bool], Message] = {}
        #: Seconds a stop gives the line being answered, after the bot's own grace (``Bot.stop``).
        self.stop_grace_s = 2.0
        #: Where a line still unanswered then is kept for the next start (``qunbot chat``: ``bot.parked.park``).
        self.park: Callable[[Message], Awaitable[object]] | None = None
        self._streaming: dict[str, str] = {}
        self._line_open = False
        self._names: dict[str, str] = {user: user}
        #: Show "name › " while waiting for input; by default only when talking to a terminal.
        self.prompt = prompt if prompt is not None else _isatty(self.stdin) and _isatty(self.stdout)
        self._prompt_shown = False
        self._mention = re.compile(r"(?<![A-Za-z0-9_.@])@" + re.escape(bot_name) + r"(?![A-Za-z0-9_.])[ \t]*", re.I)

    @property
    def chat(self) -> ChatRef:
        if self.group:
            return ChatRef(platform=self.platform, chat_id="console-group", kind="group")
        return ChatRef(platform=self.platform, chat_id=self.user, kind="private")

    def _write(self, text: str) -> None:
        if self._prompt_shown:
            # The bot speaks while the prompt waits: take the prompt off its line first.
            self.stdout.write("\r\x1b[2K" if _isatty(self.stdout) else "\n")
            self._prompt_shown = False
        # What it writes may quote anyone (a search result, a member): no control sequence reaches the
        # terminal (a window title, the clipboard by OSC 52, erased lines).
        self.stdout.write(_CONTROLS.sub("", text))
        self.stdout.flush()

    def _show_prompt(self) -> None:
        if self.prompt and not self._prompt_shown and not self._line_open:
            self.stdout.write(_CONTROLS.sub("", f"{self.user} › "))  # --user or a typed name: as _write
            self.stdout.flush()
            self._prompt_shown = True

    async def start(self) -> None:
        mode = (f"群聊模式：用「名字: 内容」切换发言人，@{self.bot_name} 或「{self.bot_name}: 内容」呼叫机器人"
                if self.group else "私聊模式")
        self._write(f"qunbot console ({mode}); /help 查看命令，Ctrl-D 退出。\n")
        self._show_prompt()
        if self._lines is None:  # one reader of the terminal, however often the channel restarts
            self._lines = asyncio.Queue()
            # Not asyncio.to_thread: asyncio.run() joins the default executor at exit, and a
            # readline() blocked on the terminal would then hang shutdown (SIGTERM, Ctrl-C).
            threading.Thread(target=self._pump, args=(asyncio.get_running_loop(), self._lines), name="console-stdin",
                             daemon=True).start()
        self._reader = asyncio.create_task(self._read_loop(self._lines), name="console-reader")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()  # (not the answer it waits for: that one gets the grace below)
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        answering = dict(self._answering)
        await self.finish_deliveries(self.stop_grace_s)
        for task, message in answering.items():
            if task.cancelled() and self.park is not None:  # cut short: the terminal never sends it again
                await self.park(message)

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
            name = head.strip()
            if sep and self._is_name(name, sep, rest):
                speaker, text = name, rest.strip()
                self.user = speaker
                self._names.setdefault(speaker, speaker)
        # A whole-word @name only (bob@qunbot.io and @qunbotfan do not call the bot), as the playground reads it.
        at_bot = self.group and self._mention.search(text) is not None
        if at_bot:
            text = cut_mention(self._mention, text)
        return Message(chat=self.chat, sender=Sender(user_id=speaker, name=speaker), message_id=uuid.uuid4().hex,
                       text=text, timestamp=datetime.now(UTC), mentions_bot=at_bot)

    def _is_name(self, name: str, colon: str, rest: str) -> bool:
        """Whether ``name`` before ``colon`` names a speaker (not a time, a link, a heading like "note:x")."""
        if (not name or len(name.split()) > 1 or name.startswith(("/", "@")) or name.isdigit() or rest.startswith("//")
                or _CONTROLS.search(name) or name.casefold() == self.bot_name.casefold()):
            return False  # ("qunbot: /summary" talks to the bot)
        # As the help puts it, "name: text": a new name needs the space after an ASCII colon.
        return name in self._names or colon != ":" or rest[:1] in (" ", "\t")

    def _pump(self, loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[tuple[str, str | None]]) -> None:
        while True:
            try:
                line = self._readline()
            except (OSError, ValueError):  # stdin closed under us: same as end of input
                line = ("", None)
            try:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            except RuntimeError:  # the loop is closed: the bot has stopped
                return
            if line[0] == "":
                return

    def _readline(self) -> tuple[str, str | None]:
        """One line of input, and a notice when some of its bytes were not text in stdin's encoding."""
        raw = getattr(self.stdin, "buffer", None)
        if raw is None:  # text without bytes beneath (a StringIO)
            return self.stdin.readline(), None
        # Decoded here, not by the text layer: its decode error (a line pasted from a GBK terminal) lost
        # the line and ended the session; a lone byte is no reason to stop reading the terminal.
        data: bytes = raw.readline()
        encoding = getattr(self.stdin, "encoding", None) or "utf-8"
        try:
            return data.decode(encoding), None
        except UnicodeDecodeError:
            return (data.decode(encoding, "replace"),
                    f"(this line was not valid {encoding}: what could not be read is shown as \ufffd)\n")

    async def _read_loop(self, lines: asyncio.Queue[tuple[str, str | None]]) -> None:
        while True:
            line, notice = await lines.get()
            if line == "":
                if self.on_eof is not None:
                    self.on_eof()
                return
            self._prompt_shown = False  # Enter ended the prompt's line
            if notice is not None:
                self._write(notice)
            message = self.parse_line(line)
            if message is not None and not await self._answer(message):
                # typed while the bot stops: said so, not dropped in silence
                self._write("(qunbot is stopping: this line is answered when it starts again)\n")
                return
            self._show_prompt()

    async def _answer(self, message: Message) -> bool:
        """Deliver ``message`` in a task of its own and wait for it: False if the bot did not take it."""
        # The reader waits, so lines are answered one after another; a stop cancels the reader only.
        task = asyncio.create_task(self._deliver_logged(message), name=f"console-deliver-{message.message_id}")
        self._deliveries.add(task)
        self._answering[task] = message
        task.add_done_callback(self._deliveries.discard)
        task.add_done_callback(lambda t: self._answering.pop(t, None))
        await asyncio.wait({task})
        return task.cancelled() or task.result()

    async def stream_delta(self, chat: ChatRef, run_id: str, delta: str) -> None:
        if run_id not in self._streaming:
            self._streaming[run_id] = ""
            self._write(f"{self.bot_name} ▸ ")
        self._streaming[run_id] += delta
        self._write(delta)
        self._line_open = True

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        at = "".join(f"@{self._names.get(u, u)} " for u in message.mention)
        if self._line_open:
            self._write("\n")
            self._line_open = False
        streamed = self._streaming.get(message.reply_to) if message.reply_to else None
        part = message.text.strip()
        # A run may send a tool's message before its streamed final text: match the text, not the order.
        # A long reply comes in parts (max_text_len): each is on screen already, the last ends the stream.
        if streamed is not None and part and streamed.rstrip().endswith(part):
            del self._streaming[str(message.reply_to)]  # the reply's last part: its stream is over
            self._show_prompt()
            return SendReceipt(platform_message_id=message.key)  # already on screen
        if streamed is not None and part and _PART.search(message.key) and part in streamed:
            self._show_prompt()
            return SendReceipt(platform_message_id=message.key)  # already on screen
        self._write(f"{self.bot_name} ▸ {at}{message.text}\n")
        self._show_prompt()
        return SendReceipt(platform_message_id=message.key)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):  # closed or detached
        return False
