"""Test seams for qunbot and its plugin authors: a scripted model and a fake OpenAI server."""

from function_calls.testing.loopback import LoopbackServer
from function_calls.testing.scripted import ScriptedModel, call, text
from function_calls.testing.server import (
    Call,
    Delay,
    Disconnect,
    FakeOpenAIServer,
    Fault,
    Raw,
    RecordedRequest,
    Reply,
    chunk,
)

__all__ = [
    "Call",
    "Delay",
    "Disconnect",
    "FakeOpenAIServer",
    "Fault",
    "LoopbackServer",
    "Raw",
    "RecordedRequest",
    "Reply",
    "ScriptedModel",
    "call",
    "chunk",
    "text",
]
