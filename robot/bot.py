"""``Bot``: wires the settings, the store, the channels, the plugins and the LLM router."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from pydantic import BaseModel

from function_calls import (
    ArgumentError,
    Caller,
    ChatModel,
    FunctionCallRouter,
    Limits,
    LoopConfig,
    Runner,
    RunResult,
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolError,
    ToolResult,
    Toolset,
)
from robot import privacy, stopping
from robot.approvals import Approvals
from robot.ask_user import Questions, ask_user
from robot.channels.base import Channel, NotTaken, PanelProvider
from robot.channels.one_process import OneProcessChannels
from robot.channels.state_store import ChannelState
from robot.commands import (
    CommandError,
    CommandLine,
    CommandSyntax,
    build_arguments,
    format_argument_error,
    refusal,
)
from robot.config import Settings
from robot.config_file import check_config
from robot.history import HistoryStore
from robot.hooks import ContextHook, ForgetHook
from robot.limits import DailyBudget, RateLimiter
from robot.maintenance import housekeep
from robot.message import ChatRef, Message, OutgoingMessage
from robot.outbox import Outbox
from robot.parked import KEEP, ParkedMessages
from robot.pipeline import _CORE_COMMANDS, Pipeline
from robot.plugin import Plugin, distinct, load_plugin, not_in_setup, set_up, withheld
from robot.privacy import Forgetter
from robot.scheduled import run_scheduled
from robot.storage import Engine, Pending
from robot.storage.leases import LeaseKeeper, Leases
from robot.store import Database, DedupeStore
from robot.wiring import build_channels, build_model

__all__ = ["Bot", "build_channels"]

log = logging.getLogger(__name__)
#: The tool names the run in progress is limited to (see Bot.tool_scope); None: no limit.
_SCOPE: ContextVar[frozenset[str] | None] = ContextVar("qunbot_tool_scope", default=None)
#: Inside robot.parked's replay: a message that fails again is NotTaken, so its row stays kept.
_REPLAYING: ContextVar[bool] = ContextVar("qunbot_replaying", default=False)


class Bot:
    """A running qunbot. Construct, ``await start()``, and ``await stop()`` (SIGINT/SIGTERM/SIGHUP do)."""

    def __init__(self, settings: Settings, *, model: ChatModel | None = None,
                 channels: Sequence[Channel] | None = None, plugins: Sequence[Plugin[Any] | str] | None = None,
                 clock: Callable[[], datetime] | None = None, database: str | None = None) -> None:
        self.settings, self.zone = settings, settings.zone
        specs = plugins if plugins is not None else settings.bot.plugins
        self.plugins: list[Plugin[Any]] = distinct([p if isinstance(p, Plugin) else load_plugin(p) for p in specs])
        check_config(settings, self.plugins)
        store = settings.storage
        self.db: Engine = Database(database) if database else store.engine(settings.bot.data_dir)
        self.clock: Callable[[], datetime] = clock or self.db.now  # the database's time: see Engine.now
        hist = settings.history
        self.history = HistoryStore(self.db, max_messages=hist.max_messages, max_age=timedelta(days=hist.retention_days),
                                    max_text_chars=hist.max_message_chars)
        #: Which process holds what (accounts, and this process's own liveness): see robot.storage.leases.
        self.leases = LeaseKeeper(Leases(self.db, ttl_s=settings.storage.lease_s, clock=self.clock))
        self.dedupe = DedupeStore(self.db, leases=self.leases.leases)
        self.pending = Pending(self.db)  #: writes the database refused (settlements, handled marks), retried
        #: The web playground, the console, WeCom's callback: run here only while this process holds them.
        self.one_process = OneProcessChannels(self)
        self.outbox = Outbox(self.db, bot_name=settings.bot.name, clock=self.clock,
                             max_in_flight=settings.outbox.max_in_flight, max_attempts=settings.outbox.max_attempts,
                             leases=self.leases, priority_s=settings.outbox.burst_priority_s)
        lim = settings.limits
        self.limiter = RateLimiter(lim.user_per_minute, lim.user_burst, lim.chat_per_minute, lim.chat_burst,
                                   command_per_minute=lim.command_per_minute, command_burst=lim.command_burst)
        self.budget = DailyBudget(self.db, self.zone, user_tokens=lim.user_daily_tokens,
                                  chat_tokens=lim.chat_daily_tokens, bot_tokens=lim.bot_daily_tokens,
                                  clock=self.clock, leases=self.leases.leases, pending=self.pending)
        self.model = model if model is not None else build_model(settings)
        in_memory = str(getattr(self.db, "path", "")) == ":memory:"
        self.questions = Questions()  #: a running plan's questions, answered by the asker's next message
        self.approvals = Approvals(self, settings.approvals,
                                   None if in_memory else settings.bot.data_dir / "secret.key")
        #: Channels' cursors and credentials, shared by every process on the database (credentials sealed).
        self.channel_state = ChannelState(self.db, None if in_memory else settings.bot.data_dir / "secret.key")
        self.router: FunctionCallRouter | None = None
        if self.model is not None:
            llm = settings.llm
            limits = Limits(max_iterations=llm.max_iterations, max_tool_calls=llm.max_tool_calls,
                            max_run_tokens=llm.max_run_tokens)
            loop = LoopConfig(warn=llm.loop_warn, critical=llm.loop_critical, breaker=llm.loop_breaker)
            runner = Runner(self.model, limits=limits, loop_config=loop, budget=self.budget,
                            approver=self.approvals.approver, strict_tools=llm.strict_tools)
            self.router = FunctionCallRouter(runner, bot_name=settings.bot.name, persona=settings.bot.persona,
                                             history_tokens=llm.history_tokens)
        self.channels = {c.platform: c for c in (build_channels(settings) if channels is None else channels)}
        #: Its name on a platform where it goes by another (OneBot's bot_name): the gate answers to it, the model is told.
        self.platform_names = {p: n for p, c in self.channels.items()
                               if isinstance(n := getattr(c, "bot_name", None), str) and n and n != settings.bot.name}
        if self.router is not None:
            self.router.names = self.platform_names
        merged = Toolset("bot", privacy.toolset)  # /forget me is always there, whatever plugins are loaded
        for plugin in self.plugins:
            merged = merged.merge(plugin.tools)
        if self.model is not None and settings.approvals.ask_user:  # the model's way to ask; no command
            merged = merged.merge(Toolset("core", [ask_user]))
        # /help, /approve, /deny and /pending are answered before any tool: one named so would never run.
        for tool in merged:
            clash = [n for n in (tool.name, *tool.aliases) if n.casefold() in _CORE_COMMANDS]  # (/Help is /help)
            if clash:
                raise ToolDefinitionError(f"tool {tool.name!r}: /{clash[0]} is a built-in command; choose another name")
        self.tools = merged
        self._deps: dict[str, Any] = {}
        self._failing_checks: set[str] = set()  #: plugins whose ``unavailable`` raises (logged once)
        #: Side panels plugins offer (the web playground shows them), e.g. a chat's reminders.
        self.panels: dict[str, PanelProvider] = {}
        #: What plugins delete on ``/forget me`` (reminders, summaries, memories); see :mod:`robot.privacy`.
        self.forgetters: list[Forgetter] = []
        privacy.follow_forgets(self)  # another process's /forget me empties this one's caches too
        #: Plugins' hooks (see :mod:`robot.hooks`): extra context before each chat run, and ``/forget <id>``.
        self.context_hooks: list[ContextHook] = []
        self.forget_hooks: list[ForgetHook] = []
        self._plugin_of: dict[str, Plugin[Any]] = {t.name: p for p in self.plugins for t in p.tools}
        #: Tools whose ``/command`` has its own syntax (``Plugin.commands``).
        self.command_syntax: dict[str, CommandSyntax] = {n: s for p in self.plugins for n, s in p.commands.items()}
        self.pipeline = Pipeline(self)
        self.parked = ParkedMessages(self.db, self.clock)  # what came as it stopped: handled at the next start
        self.forgetters.append(Forgetter("parked", "条未处理的消息", self.parked.forget))
        self._replay: asyncio.Task[None] | None = None
        self._inflight: dict[asyncio.Task[None], Message] = {}  #: the messages being handled, by their task
        self._cut: set[asyncio.Task[None]] = set()  #: those the stop cut short (robot.stopping.cut_short)
        self._housekeeping: asyncio.Task[None] | None = None
        self.started = False
        # Set once every plugin is set up: a plugin's start-up (reminders catching up) may call
        # another plugin's tool, which must not run before that plugin has its deps.
        self._plugins_ready = asyncio.Event()

    # --- services plugins use -------------------------------------------------------------
    def deps_for(self, tool: Tool) -> Any:
        plugin = self._plugin_of.get(tool.name)
        return self._deps.get(plugin.name, self) if plugin else self

    def unavailable_tools(self) -> dict[str, str]:
        """``{tool name: reason}`` for the tools plugins withhold now (see :func:`robot.plugin.withheld`)."""
        return withheld(self.plugins, self._deps, self._failing_checks)

    def offered_tools(self) -> Toolset:
        """The tools a run may be offered now; inside :meth:`tool_scope`, only the scope's."""
        blocked, scope = self.unavailable_tools(), _SCOPE.get()
        return self.tools.filter(lambda t: t.name not in blocked and t.name not in privacy.COMMAND_ONLY
                                 and (scope is None or t.name in scope))

    @contextlib.contextmanager
    def tool_scope(self, names: Iterable[str]) -> Iterator[None]:
        """Limit :meth:`offered_tools` to ``names`` for a run (a scheduled run's allow list, a resumed
        run's recorded tools): tools that start runs of their own (the plan tier) inherit the limit."""
        outer = _SCOPE.get()
        token = _SCOPE.set(frozenset(names) if outer is None else frozenset(names) & outer)
        try:
            yield
        finally:
            _SCOPE.reset(token)

    async def move_chat(self, old: ChatRef, new: ChatRef) -> None:
        """A chat got a new id on its platform: move its history, outbox rows and plugins' data."""
        moved = await self.history.move_chat(old, new)
        await self.outbox.move_chat(old, new)
        await self.approvals.store.move_chat(old, new)
        for plugin in self.plugins:
            if plugin.chat_moved is not None and plugin.name in self._deps:
                await plugin.chat_moved(self._deps[plugin.name], old, new)
        log.info("chat %s moved to %s (%d messages)", old.key, new.key, moved)

    def command_menu(self) -> list[tuple[str, str]]:
        """``(command, first line of its description)`` for the tools anyone may run, then help."""
        menu = [(t.name, " ".join(t.description.strip().split("\n\n")[0].split()))
                for t in self.offered_tools() if not t.admin_only]
        return [*menu, ("help", "显示可用命令")]

    def is_admin(self, platform: str, user_id: str) -> bool:
        return f"{platform}:{user_id}" in self.settings.bot.admins

    def caller_for(self, message: Message, *, addressed: bool = True) -> Caller:
        """The run's identity, from the platform: admins by config or by group role."""
        bot_admin = self.is_admin(message.platform, message.sender.user_id)
        admin = bot_admin or (message.chat.kind == "group" and message.sender.role in ("owner", "admin"))
        return Caller(platform=message.platform, user_id=message.sender.user_id,
                      user_name=message.sender.name or message.sender.user_id, chat_id=message.chat.chat_id,
                      chat_kind=message.chat.kind, is_admin=admin, bot_admin=bot_admin, addressed=addressed,
                      message_id=message.message_id, account=message.chat.account,
                      anonymous=message.sender.anonymous)

    def zone_for(self, chat: ChatRef) -> ZoneInfo:
        """The chat's zone (``[bot] zones``), else the bot's."""
        return self.settings.zone_for(chat.key)

    def ignores(self, chat: ChatRef) -> bool:
        """Whether the gate ignores ``chat`` (``[gate] never``, outside ``allowlist``): nothing goes there."""
        return self.pipeline.ignored(chat)

    async def send(self, chat: ChatRef, text: str, *, key: str, mention: Sequence[str] = ()) -> bool:
        """Queue a message through the outbox (``key`` makes it idempotent); not to a chat the gate ignores."""
        if self.ignores(chat):  # (a digest, a dream post set up before the owner closed that group)
            return False
        return bool(await self.outbox.enqueue(OutgoingMessage(key=key, chat=chat, text=text, mention=tuple(mention))))

    async def run_scheduled(self, prompt: str, caller: Caller, allow: Sequence[str],
                            zone: ZoneInfo | None = None) -> RunResult | None:
        """A stored prompt run by the model (reminders' prompt mode); None without an LLM."""
        return await run_scheduled(self, prompt, caller, allow, zone)

    async def call_tool(self, name: str, caller: Caller, arguments: str | dict[str, Any], *,
                        via: Literal["command", "scheduled"] = "command", zone: ZoneInfo | None = None) -> ToolResult:
        """Run one tool by name or alias as ``caller``, no LLM: how a plugin uses another plugin's tool and
        a stored command runs. ``arguments``: a command line or an arguments object. A typed ``/command``'s
        checks apply; a ``confirm`` tool is refused (nobody is there). Raises :class:`ToolError` (Chinese
        ``user_message``) for anything refused or failed; :class:`PluginError` when awaited in a plugin's setup."""
        not_in_setup(f"bot.call_tool({name!r})")
        await self._plugins_ready.wait()
        tool = self.tools.resolve(name)
        if tool is None or tool.confirm == "input":
            raise ToolError(f"no tool {name!r}", user_message=f"没有 /{name} 这个命令。")
        off = self.unavailable_tools().get(tool.name)
        reason = refusal(tool, caller) or (f"/{name} 暂不可用：{off}" if off else None)
        if tool.confirm and reason is None:
            reason = f"/{name} 需要确认，不能自动执行。"
        if reason:
            raise ToolError(f"refused: {reason}", user_message=reason)
        zone = zone or self.zone_for(ChatRef.of(caller))
        syntax = self.command_syntax.get(tool.name)
        try:
            raw = self.command_arguments(tool, arguments, zone) if isinstance(arguments, str) else arguments
            args = tool.parse_arguments(raw)
        except CommandError as exc:
            raise ToolError(str(exc), user_message=str(exc)) from None
        except ArgumentError as exc:
            raise ToolError(exc.message, user_message=format_argument_error(
                tool, exc, usage=syntax.usage if syntax else None, language=self.settings.bot.language)) from None
        try:
            return await self.invoke_tool(tool, args, caller, zone, via=via, run_id=via,
                                          call_id=f"{via}-{tool.name}")
        except TimeoutError:
            raise ToolError(f"/{name} timed out", user_message=f"/{name} 执行超时（{tool.timeout_s:g} 秒）。") from None

    def command_arguments(self, tool: Tool, line: str, zone: ZoneInfo, sent: datetime | None = None) -> dict[str, Any]:
        """A command line's arguments (a typed ``/command``: the tool's own syntax if any). "明天8点" counts from
        when it was ``sent``, unless later than now or a day before (kept no longer: a wrong clock)."""
        syntax = self.command_syntax.get(tool.name)
        if syntax is not None:
            now = self.clock()
            now = sent if sent is not None and now - KEEP <= sent < now else now
            return syntax.parse(CommandLine(tool, line, zone, now, self.router is not None))
        return build_arguments(tool, line)

    async def invoke_tool(self, tool: Tool, args: BaseModel | None, caller: Caller, zone: ZoneInfo, *,
                          via: Literal["command", "scheduled"], run_id: str, call_id: str) -> ToolResult:
        """Run a validated call without any LLM, within ``timeout_s``; raises what the tool raises. An
        empty reservation collects the tool's own spending (a summary's model calls), charged once here."""
        ctx: ToolContext[Any] = ToolContext(deps=self.deps_for(tool), caller=caller, zone=zone, clock=self.clock,
                                            run_id=run_id, tool_call_id=call_id, via=via)
        async with self.budget.reserve(caller, 0):
            async with asyncio.timeout(tool.timeout_s):  # no task per command (wait_for made one before 3.12)
                result = await tool.invoke(ctx, args)
            if result.usage is not None and result.usage.requests:
                await self.budget.charge_tools(caller, result.usage)
        return result

    # --- lifecycle ------------------------------------------------------------------------
    async def handle(self, message: Message) -> None:
        """The channels' sink. Errors are logged, never raised into a channel, but :class:`NotTaken` for a
        message that arrives while the bot stops, or that failed with nobody told: left to redelivery, and
        kept for the next start (:mod:`robot.parked`), as is one whose handling the stop cuts short."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight[task] = message
        try:
            taken = await self.pipeline.handle(message)
        except asyncio.CancelledError:
            if self.started:
                raise
            # Cut short by the stop (its channel's grace ran out, or robot.stopping.cut_short): OneBot and the
            # web page never send it again, so it is kept unless its reply is queued. The bot's own cut is no
            # cancellation of the caller's: to the caller the message was taken (kept), or NotTaken.
            kept = await self.parked.park_unanswered(message)
            if task is None or task not in self._cut or task.uncancel():
                raise
            if not kept:
                raise NotTaken(f"{message.platform} message {message.message_id}: cut short by the stop") from None
            return
        except Exception:
            log.exception("handling %s message %s failed", message.platform, message.message_id)
            return
        finally:
            if task is not None:
                self._inflight.pop(task, None)
                self._cut.discard(task)
        if not taken:
            kept = await self.parked.park(message)
            if kept and self.started and not _REPLAYING.get():
                # Failing while the bot runs: kept, robot.parked hands it over again within every_s. Taken, as
                # far as its channel knows (a poll cursor held back froze for every later message).
                return
            raise NotTaken(f"{message.platform} message {message.message_id}: not taken (stopping, or failing)")

    async def _replayed(self, message: Message) -> None:
        """:meth:`handle` for a message robot.parked kept: failing again, it stays kept (NotTaken)."""
        token = _REPLAYING.set(True)
        try:
            await self.handle(message)
        finally:
            _REPLAYING.reset(token)

    async def start(self) -> None:
        """Open the store, set up plugins, start the channels, then the outbox.

        If any step fails (say, a channel's port is taken), what did start is stopped again
        before the error propagates, so no socket, worker or DB thread is left behind.
        """
        await self.db.open()
        self.started, self.pipeline.admission.closed = True, False  # (closed by a stop before)
        try:
            await self.channel_state.check_key()  # the database's secret.key: before anything seals or signs
            await self.history.restore_moves()  # chats given new ids: the gate's and zones' entries for old ones
            await self.leases.start()
            await self.one_process.start()  # web, console, WeCom: in one process, the others stand by
            for plugin in self.plugins:
                if plugin.setup is not None:
                    self._deps[plugin.name] = await set_up(plugin, self)
            self._plugins_ready.set()
            for channel in self.channels.values():
                self.outbox.register(channel)
                self.wire(channel)
            for channel in self.channels.values():
                await channel.start()
            # Channels first: what waited in the outbox goes out the moment they connect, not on a timer.
            await self.outbox.start()
            await self.approvals.start()
            menu = self.command_menu()
            for channel in self.channels.values():
                await channel.publish_commands(menu)
            self._housekeeping = asyncio.create_task(housekeep(self), name="qunbot-housekeeping")
            self._replay = asyncio.create_task(self.parked.keep_replaying(self._replayed), name="qunbot-parked")
            self.one_process.started()
        except BaseException:
            await self.stop(flush_timeout_s=0)
            raise
        log.info("qunbot started: channels=%s tools=%s llm=%s", list(self.channels), self.tools.names(),
                 self.model.name if self.model else None)

    def wire(self, channel: Channel) -> None:
        """Give ``channel`` the bot's sink, leases, panels, forgetters, history (recalls deleted) and state (before it
        starts)."""
        channel.attach_leases(self.leases)
        channel.bind(self.handle)
        channel.bind_moves(self.move_chat)
        channel.attach_panels(self.panels)
        channel.attach_forgetters(self.forgetters)
        channel.attach_chats(self.history.recent, self.zone_for)
        channel.bind_recalls(lambda chat, id_, sender: self.history.forget_message(chat, id_, sender, receipts=True))
        channel.attach_state(self.channel_state)

    async def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Finish in-flight work, stop plugins, flush the outbox, then close the channels (last: the outbox
        can still deliver) and the store; what was not delivered stays stored and goes out at the next start,
        and what was cut short is answered then (:mod:`robot.stopping`)."""
        if not self.started:
            return
        self.started = False
        await stopping.stop(self, flush_timeout_s)
