"""The commented config template (``qunbot init``), generated from the settings models.

The README's config reference is this same text, and a test keeps the two identical, so the
documentation cannot drift from the code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from robot.config import (
    ApprovalsSection,
    BotSection,
    ChannelsSection,
    GateSection,
    HistorySection,
    LimitsSection,
    LLMSection,
    OutboxSection,
    StorageSection,
)

__all__ = ["render_template"]


def _value(value: Any) -> str:
    if isinstance(value, SecretStr):
        return '""'
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, default=str)


def _field_lines(name: str, info: FieldInfo) -> list[str]:
    default = info.get_default(call_default_factory=True)
    comment = f"  # {info.description}" if info.description else ""
    if default is None:
        return [f"# {name} = ...{comment}"]
    return [f"{name} = {_value(default)}{comment}"]


def _table(title: str, model: type[BaseModel]) -> list[str]:
    lines = [f"[{title}]"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            nested.append((f"{title}.{name}", ann))
            continue
        lines.extend(_field_lines(name, info))
    out = [*lines, ""] if len(lines) > 1 else []
    for sub_title, sub in nested:
        out.extend(_table(sub_title, sub))
    return out


def render_template(plugin_sections: Sequence[tuple[str, type[BaseModel]]] = ()) -> str:
    """The full commented ``qunbot.toml``; ``...`` marks keys with no default (unset)."""
    lines = [
        "# qunbot configuration. Every key can be overridden by QUNBOT_<TABLE>__<KEY>,",
        "# e.g. QUNBOT_LLM__MODEL=gpt-4o-mini; OPENAI_API_KEY, OPENAI_BASE_URL and",
        "# PERPLEXITY_API_KEY are honoured as fallbacks. Lines starting with '# key = ...' are unset.",
        "",
    ]
    core: list[tuple[str, type[BaseModel]]] = [("bot", BotSection), ("llm", LLMSection),
                                               ("limits", LimitsSection), ("gate", GateSection),
                                               ("history", HistorySection), ("outbox", OutboxSection),
                                               ("storage", StorageSection), ("approvals", ApprovalsSection)]
    for title, model in core:
        lines.extend(_table(title, model))
    lines.extend(_table("channels", ChannelsSection))
    for title, model in plugin_sections:
        lines.extend(_table(title, model))
    return "\n".join(lines).rstrip() + "\n"
