"""One incoming message, end to end.

dedupe (platform, message id) -> record in history -> gate -> rate limit -> route
(a ``/command`` runs its tool directly; anything else addressed goes to the LLM) -> replies
into the outbox, each keyed by the incoming message so a redelivery cannot double them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from function_calls import ArgumentError, Caller, ToolContext, ToolError, Toolset
from robot.commands import (
    CommandError,
    build_arguments,
    format_argument_error,
    help_text,
    parse_command,
    refusal,
)
from robot.limits import RateDecision
from robot.message import ChatRef, Message, OutgoingMessage

if TYPE_CHECKING:
    from robot.bot import Bot

__all__ = ["NO_LLM_REPLY", "Pipeline"]

log = logging.getLogger(__name__)

NO_LLM_REPLY = (
    "我还没有接入大模型，暂时只能执行命令（发送 /help 查看）。\n"
    "管理员可在 qunbot.toml 的 [llm] 中设置 model、base_url、api_key，"
    "或设置环境变量 QUNBOT_LLM__MODEL 和 OPENAI_API_KEY 后重启。"
)
_AFTER_NAME = frozenset(",，:：、~～!！?？.。@")
RATE_NOTICE = "你发得有点快，请稍等一会儿再找我。"


class Pipeline:
    """The bot's message path; stateless apart from the bot it serves."""

    def __init__(self, bot: Bot) -> None:
        self.bot = bot

    def _name_prefix(self, text: str) -> str | None:
        """The text after the bot's name when it starts with it as a word ("qunbot, hi"; not "qunbotty")."""
        name = self.bot.settings.bot.name
        if not name or not text.lower().startswith(name.lower()):
            return None
        rest = text[len(name):]
        if rest and not (rest[0].isspace() or rest[0] in _AFTER_NAME):
            return None
        return rest.lstrip(" ,，:：、~～")

    def _is_command(self, text: str) -> bool:
        command = parse_command(text)
        return command is not None and (command.name in ("help", "帮助")
                                        or self.bot.tools.resolve(command.name) is not None)

    def gate(self, message: Message, *, replied_to_bot: bool = False) -> tuple[bool, bool, str]:
        """(answer?, explicitly addressed?, text without the name prefix).

        A group listed in ``gate.always`` is answered without an @, but such a message is not
        *addressed*: tools with ``require_at`` are then neither offered nor run.
        """
        text = message.text.strip()
        chat = message.chat
        gate = self.bot.settings.gate
        short = f"{chat.platform}:{chat.chat_id}"
        if chat.kind == "private":
            return True, True, text
        if chat.key in gate.never or short in gate.never:
            return False, False, text
        if gate.allowlist and chat.key not in gate.allowlist and short not in gate.allowlist:
            return False, False, text
        after_name = self._name_prefix(text)
        if after_name is not None:
            return True, True, after_name
        # In a group only a known /command addresses the bot: "/usr/bin" pasted in chat does not.
        if message.mentions_bot or message.reply_to_bot or replied_to_bot or self._is_command(text):
            return True, True, text
        return chat.key in gate.always or short in gate.always, False, text

    async def handle(self, message: Message) -> None:
        bot = self.bot
        if not await bot.dedupe.first_time(message.platform, message.message_id, bot.clock()):
            log.info("duplicate %s message %s ignored", message.platform, message.message_id)
            return
        await bot.history.record(message)
        if message.from_bot:
            return
        replied = bool(message.reply_to) and not message.reply_to_bot and await bot.outbox.is_own_message(
            message.chat, str(message.reply_to))
        answer, explicit, text = self.gate(message, replied_to_bot=replied)
        if not answer:
            return
        limit = bot.settings.limits.max_message_chars
        if len(text) > limit:
            await self.reply(message, [f"这条消息太长了（{len(text)} 字），请精简到 {limit} 字以内再发给我。"])
            return
        decision = bot.limiter.check(message.chat.key, message.qualified_sender)
        if decision is RateDecision.SILENT:
            return
        if decision is RateDecision.NOTICE:
            await self.reply(message, [RATE_NOTICE])
            return
        caller = bot.caller_for(message, addressed=explicit)
        command = parse_command(text)
        if command is not None:
            await self.reply(message, [await self.run_command(caller, command.name, command.rest)])
        elif bot.router is None:
            await self.reply(message, [NO_LLM_REPLY])
        else:
            await self.run_llm(message, caller, text)

    async def run_command(self, caller: Caller, name: str, rest: str) -> str:
        bot = self.bot
        unavailable = bot.unavailable_tools()
        if name in ("help", "帮助"):
            return help_text(bot.tools, caller, unavailable)
        tool = bot.tools.resolve(name)
        if tool is None:
            return f"没有 /{name} 这个命令。发送 /help 查看可用命令。"
        reason = refusal(tool, caller)
        if reason:
            return reason
        if tool.name in unavailable:
            return f"/{name} 暂不可用：{unavailable[tool.name]}"
        try:
            args = tool.parse_arguments(build_arguments(tool, rest))
            ctx: ToolContext[Any] = ToolContext(deps=bot.deps_for(tool), caller=caller, zone=bot.zone_for(ChatRef.of(caller)),
                                                clock=bot.clock, run_id="command", tool_call_id=f"cmd-{tool.name}",
                                                via="command")
            result = await asyncio.wait_for(tool.invoke(ctx, args), tool.timeout_s)
        except TimeoutError:
            return f"/{name} 执行超时（{tool.timeout_s:g} 秒），请稍后再试。"
        except CommandError as exc:
            return str(exc)
        except ArgumentError as exc:
            return format_argument_error(tool, exc)
        except ToolError as exc:
            return exc.user_message or exc.message
        except Exception:
            log.exception("command /%s failed", name)
            return f"/{name} 执行失败了，请稍后再试。"
        if result.usage is not None and result.usage.requests:
            await bot.budget.charge(caller, result.usage)
        return "\n".join(result.user_messages) if result.user_messages else result.content

    async def run_llm(self, message: Message, caller: Caller, text: str) -> None:
        bot = self.bot
        assert bot.router is not None
        channel = bot.channels.get(message.platform)
        history = await bot.history.recent(message.chat, 40, before=message.timestamp)
        streaming = channel is not None and channel.capabilities.streaming and bot.settings.llm.stream

        async def on_text(delta: str) -> None:
            if streaming and channel is not None:
                await channel.stream_delta(message.chat, message.message_id, delta)

        async def on_event(event: dict[str, Any]) -> None:
            if channel is not None:
                await channel.trace(message.chat, {**event, "message_id": message.message_id})

        tools: Toolset = bot.offered_tools()
        if channel is not None:
            await channel.typing(message.chat, True)
        try:
            result = await bot.router.chat(
                text, caller=caller, tools=tools,
                history=[h.turn() for h in history if h.message_id != message.message_id],
                zone=bot.zone_for(message.chat), deps_for=bot.deps_for, clock=bot.clock, on_text=on_text,
                on_event=on_event,
            )
        finally:
            if channel is not None:
                await channel.typing(message.chat, False)
        await on_event({"type": "run_end", "stop": result.stop.value, "detail": result.detail,
                        "tokens": result.usage.total_tokens, "model_calls": result.usage.requests})
        await self.reply(message, result.replies)

    async def reply(self, message: Message, texts: Sequence[str]) -> None:
        """Queue replies; in a group each @-mentions the person answered."""
        mention = (message.sender.user_id,) if message.chat.kind == "group" else ()
        out = [
            OutgoingMessage(key=f"{message.platform}:{message.chat.chat_id}:{message.message_id}:{i}",
                            chat=message.chat, text=text, mention=mention, reply_to=message.message_id)
            for i, text in enumerate(t for t in texts if t.strip())
        ]
        if out:
            await self.bot.outbox.enqueue(*out)
