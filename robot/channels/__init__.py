"""Platform channels: :mod:`robot.channels.base` (the abstract channel) and one module or
subpackage per platform (``console``, ``onebot``, ``wecom``, ``web``), imported on demand."""

__all__: list[str] = []
