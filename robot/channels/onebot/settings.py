"""Settings of the OneBot v11 channel (the ``[onebot]`` table of the bot's config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["OneBotSettings"]


class OneBotSettings(BaseModel):
    """How the channel meets the OneBot implementation (NapCat, Lagrange, LLOneBot, a WeChat bridge).

    ``reverse`` (default): the channel listens on ``ws://host:port/path`` and the implementation
    connects to it (Universal socket; split sockets use ``path/api`` and ``path/event``).
    ``forward``: the channel connects to the implementation's WebSocket server at ``url``.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    mode: Literal["reverse", "forward"] = "reverse"
    host: str = Field(default="127.0.0.1", description="reverse mode: listen address")
    port: int = Field(
        default=8080, ge=0, le=65535, description="reverse mode: listen port (0 = any free port)"
    )
    path: str = Field(default="/onebot/v11/ws", description="reverse mode: the Universal socket path")
    url: str | None = Field(
        default=None, description="forward mode: the implementation's ws:// or wss:// URL"
    )
    access_token: SecretStr | None = Field(
        default=None, description="OneBot access token; checked/sent when set (unset: reverse mode accepts loopback only)"
    )
    # Above NapCat's own 10 s wait for a send: a slow but successful send must not look lost.
    action_timeout_s: float = Field(default=30.0, gt=0, description="how long to wait for an action's answer")
    reconnect_initial_s: float = Field(default=1.0, gt=0, description="forward mode: first reconnect delay")
    reconnect_max_s: float = Field(default=60.0, gt=0, description="forward mode: longest reconnect delay")
    reconnect_stable_s: float = Field(
        default=30.0, gt=0, description="forward mode: a connection up this long resets the reconnect delay"
    )
    bot_name: str | None = Field(default=None, description="its name in QQ chats: addresses it as [bot] name does")

    @field_validator("path")
    @classmethod
    def _normalise_path(cls, value: str) -> str:
        return "/" + value.strip().strip("/")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        if not value.startswith(("ws://", "wss://")):
            raise ValueError("url must start with ws:// or wss://")
        return value

    @field_validator("access_token")
    @classmethod
    def _empty_token_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        return value

    @model_validator(mode="after")
    def _check_mode(self) -> OneBotSettings:
        if self.mode == "forward" and self.url is None:
            raise ValueError("forward mode needs url (e.g. ws://127.0.0.1:3001)")
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise ValueError("reconnect_max_s must be >= reconnect_initial_s")
        return self

    @property
    def token(self) -> str | None:
        """The access token in clear, for the auth check; never log it."""
        return None if self.access_token is None else self.access_token.get_secret_value()
