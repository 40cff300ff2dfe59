"""One incoming message, end to end.

dedupe (platform, message id) -> ignored chat? stop -> record in history -> gate -> rate limit -> route
(a ``/command`` runs its tool directly; anything else addressed goes to the LLM) -> replies
into the outbox, each keyed by the incoming message so a redelivery cannot double them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from function_calls import ArgumentError, Caller, StopReason, ToolError, Toolset
from robot.admission import Admission
from robot.commands import CommandError, clip, format_argument_error, help_text, parse_command, refusal
from robot.history import HistoryEntry
from robot.hooks import RunExtras, observe
from robot.limits import BudgetExceeded, RateDecision
from robot.message import ChatRef, Message
from robot.replies import Replies, reply_key
from robot.storage import Tx
from robot.turns import SenderTurns, Ticket

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["CHAT_RATE_NOTICE", "NO_LLM_REPLY", "RATE_NOTICE", "Pipeline", "reply_key"]

log = logging.getLogger(__name__)

NO_LLM_REPLY = (
    "我还没有接入大模型，暂时只能执行命令（发送 /help 查看）。\n"
    "管理员可在 qunbot.toml 的 [llm] 中设置 model、base_url、api_key，"
    "或设置环境变量 QUNBOT_LLM__MODEL 和 OPENAI_API_KEY 后重启。"
)
_CONTEXT = 40  # history messages offered to the model (within its token window)
_AFTER_NAME = frozenset(",，:：、~～!！?？。")  # not "." nor "@": qunbot.com, qunbot@example.com call nobody
RATE_NOTICE = "你发得有点快，请 {seconds} 秒后再找我（在那之前我不会回复你）。"
CHAT_RATE_NOTICE = "群里找我的消息有点多，请大家 {seconds} 秒后再找我。"  # (the chat's own limit: for everyone)
_APPROVE, _DENY, _PENDING = ("approve", "批准"), ("deny", "拒绝"), ("pending", "待批准")
_CORE_COMMANDS = frozenset({"help", "帮助", *_APPROVE, *_DENY, *_PENDING})
APPROVALS_HELP = (
    "需要确认的操作会给出一个 5 位确认码：/approve 码 批准，/deny 码 [理由] 拒绝，/pending 查看等待中的请求。"
    "需要你本人确认的操作，也可以在本群（或私聊）直接回复“确认”“好的”或“yes”（只对你最近的一个请求有效）。"
)


def _names(entries: Sequence[str], chat: ChatRef) -> bool:
    """Whether a ``[gate]`` list names ``chat`` (its key or ``platform:id``), or the group it is a forum topic of."""
    return any(name in entries for name in chat.setting_names)


def _turn_key(message: Message) -> str:
    return f"{message.chat.key}\n{message.qualified_sender}"


class Pipeline:
    """The bot's message path; stateless apart from the bot it serves and the messages in hand."""

    def __init__(self, bot: Bot) -> None:
        self.bot = bot
        self._handling: set[tuple[str, str]] = set()  # (platform, message id) being answered right now
        #: New messages being answered, not yet marked handled: their reply's unit of work marks them.
        self._unmarked: set[tuple[str, str]] = set()
        self.admission = Admission(bot.settings.limits.messages_at_once, bot.outbox.crowd)
        self.replies = Replies(bot, self._unmarked)
        self.turns, self._tickets = SenderTurns(), dict[tuple[str, str], Ticket]()  # a member's runs in order

    def _name_prefix(self, text: str, platform: str = "") -> str | None:
        """The text after the bot's name (``[bot] name``, or its own on the platform: OneBot's ``bot_name``)
        when it starts with it as a word ("qunbot, hi"; not "qunbotty")."""
        for name in sorted({self.bot.settings.bot.name, self.bot.platform_names.get(platform, "")}, key=len, reverse=True):
            rest = text[len(name):] if name and text.lower().startswith(name.lower()) else None
            if rest is not None and (not rest or rest[0].isspace() or rest[0] in _AFTER_NAME):
                return rest.lstrip(" ,，:：、~～")
        return None

    def in_hand(self, message: Message) -> bool:
        """Whether ``message`` has had its turn and is being handled now."""
        return (message.platform, message.message_id) in self._handling

    def is_command(self, text: str) -> bool:  # a core's or a tool's /command (not any text after a slash)
        command = parse_command(text)
        return command is not None and (command.name in _CORE_COMMANDS
                                        or self.bot.tools.resolve(command.name) is not None)

    def ignored(self, chat: ChatRef) -> bool:
        """A group the bot is told to ignore (``gate.never``, outside ``gate.allowlist``): nothing is kept."""
        if chat.kind == "private":
            return False
        gate = self.bot.settings.gate
        return _names(gate.never, chat) or (bool(gate.allowlist) and not _names(gate.allowlist, chat))

    def gate(self, message: Message, *, replied_to_bot: bool = False) -> tuple[bool, bool, str]:
        """(answer?, explicitly addressed?, text without the name prefix).

        A group listed in ``gate.always`` is answered without an @, but such a message is not
        *addressed*: tools with ``require_at`` are then neither offered nor run.
        """
        text = message.text.strip()
        chat = message.chat
        if chat.kind == "private":
            return True, True, text
        if self.ignored(chat):
            return False, False, text
        after_name = self._name_prefix(text, chat.platform)
        if after_name is not None:
            return True, True, after_name
        # In a group only a known /command addresses the bot: "/usr/bin" pasted in chat does not.
        if message.mentions_bot or message.reply_to_bot or replied_to_bot or self.is_command(text):
            return True, True, text
        return _names(self.bot.settings.gate.always, chat), False, text

    async def handle(self, message: Message) -> bool:
        """Store the message with its dedupe row, answer it, then mark it handled (a crash before leaves it to
        redelivery); it starts in its turn (:mod:`robot.admission`). False when not taken: the bot is
        stopping, or its handling failed and the sender could not even be told to try again."""
        async with self.admission.turn() as admitted:
            if admitted:
                return await self._handle_turn(message)
        return False

    async def _handle_turn(self, message: Message) -> bool:
        bot, ident = self.bot, (message.platform, message.message_id)
        if ident in self._handling:
            log.info("%s message %s redelivered while being handled: ignored", *ident)
            return True
        ignored = self.ignored(message.chat)  # not answered, so not recorded either
        # A message the model will answer has its history window read in the same unit of work as
        # its record: one round trip to the database fewer per message.
        early = not ignored and self._for_model(message)
        context: list[list[HistoryEntry]] = []  # set when the window was read (a redelivery is not recorded again)

        def record(db: Tx) -> None:
            if not ignored:
                bot.history.record_sync(db, message)
                if early:
                    context[:] = [bot.history.recent_sync(db, message.chat, _CONTEXT, before=message.timestamp,
                                                          before_message=message.message_id)]

        self._handling.add(ident)  # before the dedupe's await: a copy arriving meanwhile ran too
        if early:  # its place in its member's line, in the order messages arrive (robot.turns)
            self._tickets[ident] = self.turns.enter(_turn_key(message))
        try:
            try:
                fresh: bool | None = await bot.dedupe.receive(*ident, bot.clock(), record)
            except Exception:  # the database is failing: still answer (the reply may be all that works)
                log.exception("storing %s message %s failed; answering it anyway", *ident)
                fresh = None
            if fresh is False:
                log.info("duplicate %s message %s ignored", *ident)
                return True
            if fresh:
                self._unmarked.add(ident)
            try:
                await self._handle(message, context[0] if fresh and context else None)
            except asyncio.CancelledError:  # the stop cut it short: kept to be answered again, unless a call
                if ident in self.replies.ran and ident not in self.replies.said:  # took effect (it would twice)
                    await self.replies.stopped(message)
                raise
            except Exception:
                # Nothing said (a unit the failing database refused, the direct send as well): acknowledged
                # as it is, the message would be lost. The sender is told to try again (or, once a call took
                # effect, what ran); if not even that goes out, it is not taken (robot.parked keeps it).
                if ident in self.replies.said or not (self._addressed(message) or ident in self.replies.ran):
                    raise
                log.exception("handling %s message %s failed; telling the sender to try again", *ident)
                return await self.replies.sorry(message)
            unmarked = ident in self._unmarked
        finally:
            self._handling.discard(ident)
            self._unmarked.discard(ident)
            if (ticket := self._tickets.pop(ident, None)) is not None:
                ticket.leave()
            self.replies.said.discard(ident)
            self.replies.ran.pop(ident, None)
        if fresh and unmarked:  # answered without a reply (or its enqueue failed): marked on its own
            try:
                await bot.dedupe.done(*ident)
            except Exception as exc:  # retried: a redelivery meanwhile would be answered again
                bot.pending.add(lambda db: bot.dedupe.done_sync(db, *ident), "marking {} message {} handled"
                                .format(*ident), exc, idempotent=True)
        return True

    def _for_model(self, message: Message) -> bool:
        """Whether the model is likely to answer ``message`` (answered, not as a command; no database)."""
        if self.bot.router is None or message.from_bot:
            return False
        answer, explicit, text = self.gate(message)
        return answer and bool(text.strip()) and not (explicit and parse_command(text) is not None)

    def _addressed(self, message: Message) -> bool:
        """Whether ``message`` asks for an answer, as far as is known without the database."""
        return not message.from_bot and self._asks(*self.gate(message))

    def _asks(self, answer: bool, explicit: bool, text: str) -> bool:
        """Whether what the gate said (:meth:`gate`) is answered. Unaddressed (a [gate] always group) a line is the
        model's alone, and without a model it is left alone rather than told "no model" line after line."""
        return answer and (explicit or (self.bot.router is not None and bool(text.strip())))

    async def _replied_to_bot(self, message: Message) -> bool:
        """Whether ``message`` is a reply to one of the bot's own messages (its outbox's receipts). Only
        a hint: with the database failing it is taken as not, and the message answered if addressed."""
        if not message.reply_to or message.reply_to_bot:
            return False
        try:
            return await self.bot.outbox.is_own_message(message.chat, str(message.reply_to))
        except Exception:
            log.exception("reading whether %s message %s replies to the bot failed", message.platform,
                          message.message_id)
            return False

    async def _handle(self, message: Message, context: list[HistoryEntry] | None = None) -> None:
        bot = self.bot
        if self.ignored(message.chat):
            return
        if message.from_bot:
            return
        # An answer to a plan's question or a paused run (ask_user, a plain "确认"), addressed or not, cut
        answer_text = message.text[:bot.settings.limits.max_message_chars]  # to the size limit as any message
        if not self.is_command(answer_text) and bot.questions.answer(message.chat.key, message.qualified_sender,
                                                                      answer_text):  # (a /deny is no answer)
            return
        if await bot.approvals.intercept(message.chat, bot.caller_for(message, addressed=False), answer_text):
            return
        answer, explicit, text = self.gate(message, replied_to_bot=await self._replied_to_bot(message))
        if not self._asks(answer, explicit, text):
            return
        command = parse_command(text) if explicit else None  # ("/usr/bin/…" unaddressed is talk, not a command)
        # Every answer, the "too long" notice included, spends rate: a flood of huge messages gets one notice.
        if message.platform not in bot.settings.limits.exempt_platforms:
            chat_key, user_key, is_command = message.chat.group_key, message.qualified_sender, command is not None
            decision = bot.limiter.check(chat_key, user_key, command=is_command)
            if decision is RateDecision.SILENT:
                return
            if decision is RateDecision.NOTICE:
                wait = math.ceil(bot.limiter.wait_s(chat_key, user_key, command=is_command))
                said = CHAT_RATE_NOTICE if bot.limiter.refused_by_chat(chat_key, user_key) else RATE_NOTICE
                await self.reply(message, [said.format(seconds=max(1, wait))])
                return
        limit = bot.settings.limits.max_message_chars
        if len(text) > limit:
            await self.reply(message, [f"这条消息太长了（{len(text)} 字），请精简到 {limit} 字以内再发给我。"])
            return
        caller = bot.caller_for(message, addressed=explicit)
        if command is not None:
            started = time.perf_counter()
            reply_text = await self.run_command(caller, command.name, command.rest, message.timestamp)
            await self.reply(message, [reply_text])
            await bot.approvals.announce()
            await self.replies.trace_command(message, command.name, command.rest, reply_text, time.perf_counter() - started)
        elif bot.router is None:
            await self.reply(message, [NO_LLM_REPLY])
        elif not text.strip():  # a bare @ or the bot's name alone: no empty turn for the model (some refuse it)
            await self.reply(message, ["在呢，想让我做什么？（发送 /help 看看我会的命令）"])
        else:
            await self.run_llm(message, caller, text, context)

    async def run_command(self, caller: Caller, name: str, rest: str, sent: datetime | None = None) -> str:
        bot = self.bot
        unavailable = bot.unavailable_tools()
        if name in ("help", "帮助"):
            commands = bot.tools.filter(lambda t: t.confirm != "input")
            return (help_text(commands, caller, unavailable, llm=bot.router is not None, syntax=bot.command_syntax)
                    + "\n\n" + APPROVALS_HELP)
        if name in _APPROVE or name in _DENY:
            code, why = [*rest.split(None, 1), "", ""][:2]  # any space after the code: 全角, a new line
            if not code:
                return f"用法：/{name} 确认码" + (" [理由]" if name in _DENY else "")
            return await bot.approvals.decide(caller, ChatRef.of(caller), code, approve=name in _APPROVE,
                                              reason=why)
        if name in _PENDING:
            return await bot.approvals.pending_text(caller)
        tool = bot.tools.resolve(name)
        if tool is not None and tool.confirm == "input":
            tool = None  # ask_user is the model's way to ask; a person just says it
        if tool is None:
            return f"没有 /{clip(name)} 这个命令。发送 /help 查看可用命令。"
        reason = refusal(tool, caller)
        if reason:
            return reason
        if tool.name in unavailable:
            return f"/{name} 暂不可用：{unavailable[tool.name]}"
        syntax = bot.command_syntax.get(tool.name)
        zone = bot.zone_for(ChatRef.of(caller))
        try:
            raw = bot.command_arguments(tool, rest, zone, sent)  # ("明天" from when it was said: a kept message)
            args = tool.parse_arguments(raw)
            if tool.confirm:
                return await bot.approvals.pause_command(tool, raw, caller, ChatRef.of(caller),
                                                         caller.message_id or None)
            result = await bot.invoke_tool(tool, args, caller, zone, via="command", run_id="command",
                                           call_id=f"cmd-{tool.name}")
        except TimeoutError:
            return f"/{name} 执行超时（{tool.timeout_s:g} 秒），请稍后再试。"
        except CommandError as exc:
            return str(exc)
        except ArgumentError as exc:
            return format_argument_error(tool, exc, usage=syntax.usage if syntax else None,
                                         language=bot.settings.bot.language)
        except ToolError as exc:
            return exc.user_message or exc.message
        except Exception:
            log.exception("command /%s failed", name)
            return f"/{name} 执行失败了，请稍后再试。"
        # A command that called a model (or left a model's run going: /plan's background) spends model rate
        if (result.usage is not None and result.usage.requests) or (result.data or {}).get("background"):
            bot.limiter.charge(ChatRef.of(caller).group_key, caller.qualified_user)
        return "\n".join(result.user_messages) if result.user_messages else result.content

    async def run_llm(self, message: Message, caller: Caller, text: str,
                      history: list[HistoryEntry] | None = None) -> None:
        """Answer with the model; ``history``: the chat's window before ``message`` if already read."""
        bot = self.bot
        assert bot.router is not None
        channel = bot.channels.get(message.platform)
        ident = (message.platform, message.message_id)
        if (ticket := self._tickets.get(ident)) is None:  # (answered though not foreseen: a reply to the bot)
            ticket = self._tickets[ident] = self.turns.enter(_turn_key(message))
        until = message.timestamp
        if await ticket.wait():  # the member's run ahead ended meanwhile: the window runs to now, its answer in it
            history, until = None, max(until, bot.clock())
        if history is None:
            try:
                history = await bot.history.recent(message.chat, _CONTEXT, before=until,
                                                   before_message=message.message_id)
            except Exception:  # the database failing: answered without the chat's context rather than not at all
                log.exception("reading the history of %s failed; answering without it", message.chat.key)
                history = []
        streaming = channel is not None and channel.capabilities.streaming and bot.settings.llm.stream

        async def on_text(delta: str) -> None:
            if channel is not None:
                await channel.stream_delta(message.chat, message.message_id, delta)

        async def on_event(event: dict[str, Any]) -> None:
            self.replies.took_effect(message, event)
            if channel is not None:
                await observe(channel.trace(message.chat, {**event, "message_id": message.message_id}), "trace")

        tools: Toolset = bot.offered_tools()
        async with contextlib.AsyncExitStack() as stack:
            try:  # hold the run's cap (or what is left today) before any model call; settled by the loop
                await stack.enter_async_context(bot.budget.for_run(caller, bot.settings.llm.max_run_tokens))
            except BudgetExceeded as exc:
                log.info("budget refused a request from %s: %s", caller.qualified_user, exc)
                await self.reply(message, [exc.user_message])
                return
            if channel is not None:  # "typing…" while the model works (and its context is gathered)
                await observe(channel.typing(message.chat, True), "typing")
                stack.push_async_callback(lambda: observe(channel.typing(message.chat, False), "typing"))
            extras = await self._extras(caller, text)
            result = await bot.router.chat(
                text, caller=caller, tools=tools,
                history=[h.turn() for h in history if h.message_id != message.message_id],
                zone=bot.zone_for(message.chat), deps_for=bot.deps_for, clock=bot.clock,
                on_text=on_text if streaming else None,  # (shown nothing, a broken stream is retried)
                on_event=on_event, context=[m for e in extras for m in e.messages], sent=message.timestamp,
            )
        for extra in extras:
            if extra.settle is not None:
                try:
                    await extra.settle(result)
                except Exception:
                    log.exception("settling a context hook failed")
        await on_event({"type": "run_end", "stop": result.stop.value, "detail": result.detail,
                        "tokens": result.usage.total_tokens, "model_calls": result.usage.requests,
                        "tiers": result.tier_tokens()})
        replies = result.replies
        if result.stop is StopReason.AWAITING_APPROVAL:
            ask = await bot.approvals.pause(result, caller, message.chat, tools=tools.names(),
                                            reply_to=message.message_id)
            replies = [*result.state.user_messages, ask]
        await self.reply(message, replies)
        await bot.approvals.announce()

    async def _extras(self, caller: Caller, text: str) -> list[RunExtras]:
        """Context hooks' additions; a failing hook is logged and skipped, the run goes on."""
        out: list[RunExtras] = []
        for hook in self.bot.context_hooks:
            try:
                extra = await hook(caller, text)
            except Exception:
                log.exception("a context hook failed")
                continue
            if extra is not None:
                out.append(extra)
        return out

    async def reply(self, message: Message, texts: Sequence[str]) -> None:
        """Queue replies (:meth:`robot.replies.Replies.reply`)."""
        await self.replies.reply(message, texts)
