"""Configuration: ``qunbot.toml`` plus ``QUNBOT_<SECTION>__<KEY>`` environment overrides.

Precedence: environment > file > defaults. ``OPENAI_API_KEY``/``OPENAI_BASE_URL`` (and, for the
search plugin, ``PERPLEXITY_API_KEY``) are fallbacks when the config does not set them. A bad
file or value raises :class:`ConfigError` naming the key and the problem.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from zoneinfo import ZoneInfo

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from robot.channels.onebot.settings import OneBotSettings
from robot.channels.telegram.settings import TelegramSettings
from robot.channels.wecom.settings import WeComSettings
from robot.channels.weixin.settings import WeixinSettings
from robot.config_values import chat_key, check_url, check_zone, clean_key, qualified
from robot.message import ChatRef, group_key

if TYPE_CHECKING:
    from robot.storage import Engine

__all__ = [
    "ApprovalsSection",
    "BotSection",
    "ChannelsSection",
    "ConfigError",
    "ConsoleSettings",
    "GateSection",
    "HistorySection",
    "LLMSection",
    "LimitsSection",
    "OutboxSection",
    "Settings",
    "StorageSection",
    "TierSection",
    "WebSettings",
    "chat_key",
]

M = TypeVar("M", bound=BaseModel)
_FALLBACK_ENV = {("llm", "api_key"): "OPENAI_API_KEY", ("llm", "base_url"): "OPENAI_BASE_URL",
                 ("search", "api_key"): "PERPLEXITY_API_KEY"}


def _env_value(value: str) -> Any:
    if value.lstrip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except ValueError:
            pass  # the plugin's model says what is wrong with the text
    return value


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key and the problem."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class BotSection(_Section):
    name: str = Field("qunbot", description="the bot's name; a message starting with it addresses the bot")
    timezone: str = Field("Asia/Shanghai", description="IANA zone for reminders and the model's clock")
    data_dir: Path = Field(Path("./data"), description="where the SQLite database lives (relative to the config file's folder)")
    admins: list[str] = Field(default_factory=list, description='platform-qualified ids, e.g. "onebot:10001"')
    plugins: list[str] = Field(default_factory=lambda: ["reminders", "search", "summary", "memory", "tiers"],
                               description="plugin modules to load")
    zones: dict[str, str] = Field(default_factory=dict,
                                  description='per-chat IANA zone, e.g. {"onebot:123" = "Europe/Berlin"} (a group; or the chat key '
                                  '"onebot:group:123", "onebot:private:10001")')
    language: Literal["zh", "en"] = Field("zh", description="language of the lines explaining a command's invalid "
                                          "arguments (zh, en); the bot's other replies are Chinese")
    persona: str = Field("你是群聊里的助手，回答简洁、友好、准确。需要时调用工具；不要编造工具结果。",
                         description="system prompt persona")

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        return check_zone(value)

    @field_validator("zones")
    @classmethod
    def _zones(cls, value: dict[str, str]) -> dict[str, str]:
        for chat, zone in value.items():
            check_zone(zone, where=f"zones[{chat!r}]: ")
        return {chat_key(chat): zone for chat, zone in value.items()}  # a key no chat has did nothing

    @field_validator("admins")
    @classmethod
    def _admins(cls, value: list[str]) -> list[str]:
        return qualified(value, "admins")

    @field_validator("plugins")
    @classmethod
    def _plugins(cls, value: list[str]) -> list[str]:
        if any(not name.strip() for name in value) or len(set(value)) < len(value):
            raise ValueError(f"plugin module names must be given once each and not be empty: {value}")
        return value


class TierSection(_Section):
    """An extra model tier (``[llm.think]``: M0, thinks deeply; ``[llm.plan]``: M2, plans)."""

    model: str = Field(description="model name")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint (default: [llm] base_url)")
    api_key: SecretStr | None = Field(None, description="API key (default: [llm] api_key)")
    temperature: float | None = Field(None, ge=0, le=2)
    timeout_s: float = Field(120.0, gt=0, description="seconds per read (all of a reply not streamed); a streamed "
                             "reply gets five times this in all")
    max_iterations: int = Field(6, ge=1, le=50, description="model turns per call of the tier")
    max_tool_calls: int = Field(8, ge=0, le=100, description="tool calls per call of the tier")
    max_run_tokens: int = Field(24_000, ge=500, description="tokens per call of the tier, its sub-calls included")
    reply_within_s: float = Field(20.0, gt=0, le=540, description="plan only: longer work reports back to the chat "
                                  "later (at most 540: the plan tool times out at 600)")
    token_param: Literal["max_tokens", "max_completion_tokens"] | None = Field(
        None, description="how output caps are sent (default: [llm] token_param); reasoning models need "
        "max_completion_tokens")
    reasoning_pass_back: bool | None = Field(None, description="send reasoning_content back during tool calls "
                                             "(default: [llm] reasoning_pass_back)")
    stream: bool | None = Field(None, description="stream its replies (default: [llm] stream); false for a model its "
                                "provider will not stream (a refused stream is asked again unstreamed); a streamed "
                                "reply is left once it passes its cap")

    _url = field_validator("base_url")(check_url)
    _key = field_validator("api_key")(clean_key)


class LLMSection(_Section):
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint (falls back to OPENAI_BASE_URL)")
    api_key: SecretStr | None = Field(None, description="API key (falls back to OPENAI_API_KEY)")
    model: str | None = Field(None, description="model name; no model = commands only")
    stream: bool = Field(True, description="stream replies to channels that can show them")
    temperature: float | None = Field(None, ge=0, le=2)
    timeout_s: float = Field(60.0, gt=0, description="seconds per read (all of a reply not streamed); a streamed "
                             "reply gets five times this in all")
    strict_tools: bool = Field(False, description="send strict tool schemas")
    max_iterations: int = Field(6, ge=1, description="model turns per request")
    max_tool_calls: int = Field(5, ge=0, description="tool calls per request (a paused call counts once)")
    max_run_tokens: int = Field(24_000, ge=500, description="tokens per request")
    loop_warn: int = Field(5, ge=2, description="identical no-progress tool calls before the model is warned")
    loop_critical: int = Field(8, ge=2, description="... before the call is blocked and the request ends")
    loop_breaker: int = Field(10, ge=2, description="repeated calls in one request before everything stops")
    history_tokens: int = Field(1500, ge=0, description="chat history sent with each request")
    reasoning_pass_back: bool = Field(False, description="send reasoning_content back during tool calls "
                                      "(DeepSeek thinking mode needs it)")
    token_param: Literal["max_tokens", "max_completion_tokens"] = Field(
        "max_tokens", description="how output caps are sent; reasoning models need max_completion_tokens")
    think: TierSection | None = Field(None, description="[llm.think] table: the deep-thinking tier (deep_think tool)")
    plan: TierSection | None = Field(None, description="[llm.plan] table: the planning tier (plan tool)")

    _url = field_validator("base_url")(check_url)
    _key = field_validator("api_key")(clean_key)

    @model_validator(mode="after")
    def _loop_order(self) -> LLMSection:
        # Out of order, a later stage came first: loop_breaker=2 stopped a request before any warning.
        if not self.loop_warn <= self.loop_critical <= self.loop_breaker:
            raise ValueError(f"loop_warn ({self.loop_warn}) <= loop_critical ({self.loop_critical}) <= loop_breaker "
                             f"({self.loop_breaker}): each stage comes after the one before")
        return self

    @property
    def configured(self) -> bool:
        return bool(self.model and (self.base_url or self.api_key))


class LimitsSection(_Section):
    user_per_minute: float = Field(6, gt=0, description="requests per user per minute (token bucket)")
    user_burst: int = Field(4, ge=1)
    chat_per_minute: float = Field(30, gt=0, description="requests per chat per minute")
    chat_burst: int = Field(10, ge=1)
    user_daily_tokens: int | None = Field(200_000, ge=0, description='LLM tokens per user per day ("off" = no cap)')
    chat_daily_tokens: int | None = Field(2_000_000, ge=0, description='LLM tokens per chat per day ("off" = no cap)')
    bot_daily_tokens: int | None = Field(None, ge=0, description="LLM tokens the whole bot may spend per day "
                                         "(no cap unless set); caps the provider bill")
    max_message_chars: int = Field(8000, ge=100, description="longer messages are refused with a notice")
    messages_at_once: int = Field(64, ge=1, description="incoming messages that start being handled together; "
                                  "the others wait their turn (each keeps its place for its first second only)")
    command_per_minute: float = Field(30, gt=0, description="/commands that call no model, per user per minute")
    command_burst: int = Field(20, ge=1)
    exempt_platforms: list[str] = Field(default_factory=lambda: ["console", "web"],
                                        description="channels without rate limits (the local console and playground)")

    @field_validator("user_daily_tokens", "chat_daily_tokens", "bot_daily_tokens", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:  # TOML has no null: "off" (or "none", "") turns a cap off
        return None if isinstance(value, str) and value.strip().lower() in ("off", "none", "null", "") else value


class HistorySection(_Section):
    retention_days: int = Field(30, ge=1, description="chat history (and delivered outbox rows) older than this "
                                "many days is deleted")
    max_messages: int = Field(5000, ge=10, description="chat history kept per chat, in messages (outbox rows too)")
    max_message_chars: int = Field(10_000, ge=100, description="a longer message is stored cut, with a note saying so")


class StorageSection(_Section):
    url: SecretStr = Field(SecretStr(""), description="empty (or sqlite:///path) for the embedded SQLite file in "
                           "data_dir; postgresql://user:password@host:5432/db for several processes (see Scale out)")
    pool_size: int = Field(8, ge=1, le=100, description="PostgreSQL connections per process")
    lease_s: float = Field(15.0, ge=3, le=600, description="PostgreSQL: a process that stops renewing its accounts' "
                           "leases for this long (killed, cut off) loses them to another process (it stops serving "
                           "them itself a little before); the server ends its transactions left idle half this long")
    listen_url: SecretStr = Field(SecretStr(""), description="PostgreSQL: when url goes through a pooler in "
                                  "transaction mode (PgBouncer's pool_mode = transaction, Supabase's port 6543), a "
                                  "direct or session-mode URL of the same database for notifications (LISTEN)")

    @model_validator(mode="after")
    def _listen_url_for_postgresql(self) -> StorageSection:
        listen = self.listen_url.get_secret_value().strip()
        from robot.storage import POSTGRES_SCHEMES

        url = self.url.get_secret_value().strip()
        if listen and not (listen.startswith(POSTGRES_SCHEMES) and url.startswith(POSTGRES_SCHEMES)):
            raise ValueError("listen_url is for PostgreSQL: set it only with a postgresql:// url, to a "
                             "postgresql://... URL of the same database")
        return self

    def engine(self, data_dir: Path) -> Engine:
        """The database these settings name (not opened)."""
        from robot.storage import open_database

        # A frozen process's transaction ends within half a lease: the others, waiting on the rows it locked,
        # would otherwise see their own work stalled past their leases' trust and give their accounts up.
        return open_database(self.url.get_secret_value(), data_dir, pool_size=self.pool_size,
                             stall_s=self.lease_s / 2, listen_url=self.listen_url.get_secret_value())


class OutboxSection(_Section):
    max_in_flight: int = Field(4, ge=1, le=64, description="sends awaiting the platform at once, per channel, "
                               "and as many more slow ones: a crash can resend at most twice these")
    max_attempts: int = Field(6, ge=1, le=100, description="tries of a message whose send fails for now before it "
                              "is given up (a channel that is down does not count)")
    burst_priority_s: float = Field(2.0, ge=0, le=10, description="a burst of sends (more than 64 chats at once: "
                                    "reminders) goes out ahead of new messages, which wait this long at most (0 = off)")


class GateSection(_Section):
    always: list[str] = Field(default_factory=list, description="group chat keys answered without an @")
    never: list[str] = Field(default_factory=list, description="group chat keys never answered")
    allowlist: list[str] = Field(default_factory=list, description="if set, only these groups are answered")

    @field_validator("always", "never", "allowlist")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:  # a bare "123456" matched no chat: the setting did nothing
        bad = [k for k in value if not re.fullmatch(r"[a-z][a-z0-9_]*:(?:group:)?[^:\s][^\s]*", k)]
        if bad:
            raise ValueError(f"chats are written \"platform:group_id\" (or the chat key \"platform:group:id\"), "
                             f"e.g. \"onebot:123456\", not {bad[0]!r}")
        return value


class ApprovalsSection(_Section):
    approvers: list[str] = Field(default_factory=list, description=(
        'who may approve confirm tools besides [bot] admins, e.g. "onebot:10001"'))
    ttl_minutes: int = Field(30, ge=1, le=7 * 24 * 60, description="how long an approval request stays valid")
    max_wrong_codes: int = Field(5, ge=1, description="wrong codes one user may try in a chat before a cool-down")
    cooldown_minutes: int = Field(10, ge=1, description="how long that cool-down lasts")
    ask_user: bool = Field(True, description="offer the model ask_user (pause and wait for the asker's answer)")

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: list[str]) -> list[str]:
        return qualified(value, "approvers")


class WebSettings(_Section):
    enabled: bool = Field(False, description="the web playground (on by default when nothing is configured)")
    host: str = Field("127.0.0.1", description='"0.0.0.0" serves other machines, with no login: anyone who '
                                               "reaches it speaks as any user")
    port: int = Field(8765, ge=0, le=65535)
    allowed_hosts: list[str] = Field(default_factory=list, description=(
        "beyond loopback: names it answers to besides its IP addresses (others may be a rebinding site)"))


class ConsoleSettings(_Section):
    enabled: bool = False


class ChannelsSection(_Section):
    web: WebSettings = Field(default_factory=WebSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    onebot: OneBotSettings = Field(default_factory=OneBotSettings)
    wecom: WeComSettings = Field(default_factory=WeComSettings)
    weixin: WeixinSettings = Field(default_factory=WeixinSettings)
    telegram: TelegramSettings = Field(default_factory=TelegramSettings)


class Settings(BaseSettings):
    """The whole configuration. Unknown top-level tables belong to plugins (see :meth:`section`)."""

    model_config = SettingsConfigDict(env_prefix="QUNBOT_", env_nested_delimiter="__", extra="allow",
                                      hide_input_in_errors=True)

    bot: BotSection = Field(default_factory=BotSection)
    llm: LLMSection = Field(default_factory=LLMSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    gate: GateSection = Field(default_factory=GateSection)
    history: HistorySection = Field(default_factory=HistorySection)
    outbox: OutboxSection = Field(default_factory=OutboxSection)
    storage: StorageSection = Field(default_factory=StorageSection)
    approvals: ApprovalsSection = Field(default_factory=ApprovalsSection)
    channels: ChannelsSection = Field(default_factory=ChannelsSection)

    @model_validator(mode="after")
    def _no_web_approvers_beyond_loopback(self) -> Settings:
        # The playground has no login: bound beyond loopback anyone reaching it could speak as a web: admin
        # and approve, for every platform, what approvers alone may.
        from robot.channels.web.protocol import is_loopback

        web, ch = self.channels.web, self.channels
        others = any(c.enabled for c in (ch.console, ch.onebot, ch.wecom, ch.weixin, ch.telegram))
        served = web.enabled or not (others or ch.wecom.webhook_key is not None)  # (as wiring opens it)
        named = [a for a in (*self.bot.admins, *self.approvals.approvers) if a.startswith("web:")]
        if served and named and not is_loopback(web.host):
            raise ValueError(f"[channels.web] host = {web.host!r} serves other machines and the playground has no "
                             f"login: {', '.join(dict.fromkeys(named))} in [bot] admins / [approvals] approvers would "
                             f"let anyone who reaches it approve; bind it to 127.0.0.1 or remove the web: entries")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file arrives through init kwargs (load_settings); environment wins over it.
        return env_settings, init_settings

    def section(self, name: str, model: type[M]) -> M:
        """A plugin's table, validated by the plugin's model, with env overrides and fallbacks."""
        data: dict[str, Any] = dict((self.model_extra or {}).get(name) or {})
        prefix = f"QUNBOT_{name.upper()}__"
        for key, value in os.environ.items():
            if key.startswith(prefix):  # a list or table comes as JSON, as for the core's tables
                data[key[len(prefix):].lower()] = _env_value(value)
        for (section, key), env in _FALLBACK_ENV.items():
            if section == name and not data.get(key) and os.environ.get(env):
                data[key] = os.environ[env]
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(_explain(exc, prefix=f"[{name}] ")) from None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.bot.timezone)

    def zone_for(self, chat_key: str) -> ZoneInfo:
        """A chat's zone: ``[bot] zones`` for that chat, else the bot's ``timezone``."""
        zones = self.bot.zones  # (a forum topic: its own, else its group's; a moved chat: its old id's too)
        try:
            names: tuple[str, ...] = ChatRef.from_key(chat_key).setting_names
        except ValueError:
            names = (chat_key, group_key(chat_key))
        return ZoneInfo(next((zones[n] for n in names if n in zones), self.bot.timezone))

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # Plugin tables are plain dicts until section() validates them: they may hold API keys.
        extra = self.model_extra or {}
        for name, value in super().__repr_args__():
            if name in extra:
                value = dict.fromkeys(value, "***") if isinstance(value, dict) else "***"
            yield name, value


def _explain(exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        lines.append(f"  {prefix}{loc}: {err['msg']}")
    return "invalid configuration:\n" + "\n".join(lines)
