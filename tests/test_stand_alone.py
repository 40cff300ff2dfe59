"""The suite runs from a clean clone with nothing beside it."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_reading_beside_the_repository_is_caught(outside_reads: list[str]) -> None:
    target = REPO.parent / "shared" / "vectors" / "onebot_v11.json"
    with contextlib.suppress(OSError), target.open(encoding="utf-8"):
        pass
    assert outside_reads == [str(target)]
    outside_reads.clear()


def test_reading_inside_the_repository_is_fine(outside_reads: list[str]) -> None:
    json.loads((REPO / "tests" / "vectors" / "wecom_callback.json").read_text("utf-8"))
    assert outside_reads == []


def test_the_official_vectors_are_copied_whole() -> None:
    wecom = json.loads((REPO / "tests" / "vectors" / "wecom_callback.json").read_text("utf-8"))
    onebot = json.loads((REPO / "tests" / "vectors" / "onebot_v11.json").read_text("utf-8"))
    assert {"token", "encoding_aes_key", "receive_id", "verify_url", "decrypt_message"} <= wecom.keys()
    assert onebot, "the OneBot samples are empty"
