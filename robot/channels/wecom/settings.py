"""Configuration of the WeCom (企业微信) channel."""

from __future__ import annotations

import logging
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

log = logging.getLogger("robot.channels.wecom")

__all__ = ["WeComMode", "WeComSettings"]

WeComMode = Literal["app", "aibot"]

_AES_KEY_RE = re.compile(r"[A-Za-z0-9]{43}")


class WeComSettings(BaseModel):
    """WeCom channel settings.

    ``mode="app"``: a self-built application (自建应用); private chats, XML callbacks, replies
    through ``message/send`` with an access token. ``mode="aibot"``: the 智能机器人 (AI bot);
    private and group chats, JSON callbacks, replies as passive stream messages.
    ``webhook_key`` optionally configures a group-robot webhook (send only).
    """

    # Validation errors must not echo a secret the user typed.
    model_config = ConfigDict(hide_input_in_errors=True, extra="forbid")

    enabled: bool = False
    mode: WeComMode = "app"
    host: str = "127.0.0.1"
    port: int = Field(default=8766, ge=0, le=65535)
    path: str = "/wecom/callback"
    token: SecretStr = SecretStr("")
    encoding_aes_key: SecretStr = SecretStr("")
    corp_id: str = Field(default="", description="the receive_id of app callbacks")
    corp_secret: SecretStr = SecretStr("")
    agent_id: int | None = None
    api_base: str = "https://qyapi.weixin.qq.com"
    webhook_key: SecretStr | None = None
    bot_name: str = Field(default="", description="the AI bot's display name, stripped from '@name' mentions")
    request_timeout: float = Field(default=10.0, gt=0)
    timestamp_window_s: float = Field(
        default=300.0, gt=0, description="refuse callbacks whose timestamp is further than this from now (replays)"
    )

    @model_validator(mode="before")
    @classmethod
    def _dropped(cls, data: object) -> object:
        """``bot_user_id`` was accepted and never read (``qunbot init`` wrote it): dropped, said once."""
        if isinstance(data, dict) and "bot_user_id" in data:
            log.warning("[channels.wecom] bot_user_id does nothing: remove it from the config")
            data = {k: v for k, v in data.items() if k != "bot_user_id"}
        return data

    @field_validator("encoding_aes_key")
    @classmethod
    def _check_aes_key(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value()
        if raw and not _AES_KEY_RE.fullmatch(raw):
            raise ValueError("encoding_aes_key must be exactly 43 characters of [A-Za-z0-9]")
        return value

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("path must start with '/'")
        return value

    @field_validator("api_base")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check_enabled(self) -> WeComSettings:
        if not self.enabled:
            return self
        missing = [
            name
            for name, value in (
                ("token", self.token.get_secret_value()),
                ("encoding_aes_key", self.encoding_aes_key.get_secret_value()),
            )
            if not value
        ]
        if self.mode == "app":
            if not self.corp_id:
                missing.append("corp_id")
            if not self.corp_secret.get_secret_value():
                missing.append("corp_secret")
            if self.agent_id is None:
                missing.append("agent_id")
        if missing:
            raise ValueError(
                f"wecom mode {self.mode!r} is enabled but these are not set: {', '.join(missing)}"
            )
        return self

    @property
    def receive_id(self) -> str:
        """The receive_id inside encrypted callbacks: the corp id for apps, empty for the AI bot."""
        return "" if self.mode == "aibot" else self.corp_id
