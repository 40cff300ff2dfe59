"""Configuration of the Telegram channel (``[channels.telegram]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["TelegramSettings"]


class TelegramSettings(BaseModel):
    """A Telegram bot through the Bot API: long polling (default) or a webhook."""

    # Validation errors must not echo a token the user typed.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    enabled: bool = False
    token: SecretStr = SecretStr("")
    api_base: str = "https://api.telegram.org"
    mode: Literal["polling", "webhook"] = "polling"
    poll_timeout_s: int = Field(30, ge=0, le=50, description="getUpdates long-poll timeout")
    webhook_url: str = Field("", description="the public HTTPS URL Telegram posts to (webhook mode)")
    webhook_secret: SecretStr = Field(SecretStr(""), description="checked in X-Telegram-Bot-Api-Secret-Token")
    host: str = "127.0.0.1"
    port: int = Field(8767, ge=0, le=65535)
    path: str = "/telegram/webhook"
    set_commands: bool = Field(True, description="publish the tools as the bot's command menu (setMyCommands)")
    typing: bool = Field(True, description="send the 'typing' chat action while the model runs")
    state_dir: Path | None = Field(None, description="default: <bot.data_dir>/telegram")
    request_timeout: float = Field(15.0, gt=0)
    retry_delay_s: float = Field(1.0, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)

    @field_validator("api_base")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> TelegramSettings:
        if not self.enabled:
            return self
        if not self.token.get_secret_value():
            raise ValueError("telegram is enabled but token is not set")
        if self.mode == "webhook":
            secret = self.webhook_secret.get_secret_value()
            if not secret or not all(c.isalnum() or c in "_-" for c in secret) or len(secret) > 256:
                raise ValueError("telegram webhook mode needs webhook_secret: 1-256 characters of A-Z a-z 0-9 _ -")
            if not self.path.startswith("/"):
                raise ValueError("path must start with '/'")
        return self
