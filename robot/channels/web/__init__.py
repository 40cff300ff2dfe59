"""The web playground channel: a local page with a simulated group, private chats, streaming and tool traces.

Its WebSocket protocol is documented in :mod:`robot.channels.web.protocol`.
"""

from robot.channels.web.channel import GROUP_ID, MEMBERS, WebChannel
from robot.channels.web.protocol import FrameError, parse_frame

__all__ = ["GROUP_ID", "MEMBERS", "FrameError", "WebChannel", "parse_frame"]
