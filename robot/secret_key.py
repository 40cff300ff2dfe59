"""The install's ``secret.key``, checked against the database at start.

What a process seals or signs with the key (stored Weixin logins, runs paused for an approval) is
opened by whichever process sharing the database needs it. A process with another key (the file
not copied, or replaced) would void every paused run another process signed, as if its row had
been edited, and could not open the stored logins, while sealing new ones the others cannot open.

So the database keeps a fingerprint of the key it was first used with (an HMAC of a fixed text
under the key: it tells nothing about the key), and a process with another key, or none,
refuses to start and says which file to copy. ``qunbot adopt-secret`` makes the present key the
database's on purpose (the old one lost or leaked); what the old key sealed can then no longer
be opened.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from pathlib import Path

from robot.snapshots import load_secret
from robot.storage import Engine, Tx, iso, utcnow

__all__ = ["SCHEMA", "SecretKeyMismatch", "check_secret", "fingerprint", "matches", "stored_sync"]

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS install_secret (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "fingerprint TEXT NOT NULL, since TEXT NOT NULL)",
]
"""The ``install_secret`` component's migrations (append a step to change it, never edit one)."""


class SecretKeyMismatch(Exception):
    """This process's ``secret.key`` is not the one the database was first used with (or is missing)."""


def fingerprint(secret: bytes) -> str:
    """What the database keeps of a key: an HMAC-SHA256 of a fixed text under it."""
    return hmac.new(secret, b"qunbot secret.key fingerprint v1", hashlib.sha256).hexdigest()


def matches(secret: bytes, stored: str | None) -> bool:
    """Whether ``secret`` is the key whose fingerprint the database keeps (``stored``)."""
    return stored is not None and hmac.compare_digest(fingerprint(secret), stored)


async def check_secret(db: Engine, path: Path, *, adopt: bool = False) -> None:
    """Refuse (:class:`SecretKeyMismatch`) unless ``path`` holds the key the (open) database ``db``
    was first used with; a database that has none yet takes this one. ``adopt``: this key becomes
    the database's. ``db`` must have :data:`SCHEMA` registered as ``install_secret``."""
    known = await db.run(stored_sync)
    if known is not None and not adopt and not await asyncio.to_thread(path.exists):
        raise SecretKeyMismatch(
            f"{path} does not exist, and the database {db.where} was first used with a secret.key: copy that file "
            "here (from the data_dir of a process already using this database, or a backup) and start again; if "
            "it is lost, `qunbot adopt-secret` makes a new one the database's")
    secret = await asyncio.to_thread(load_secret, path)
    mine, now = fingerprint(secret), iso(utcnow())

    def record(tx: Tx) -> str | None:
        tx.execute("INSERT INTO install_secret (id, fingerprint, since) VALUES (1, ?, ?) ON CONFLICT (id) DO "
                   + ("UPDATE SET fingerprint = excluded.fingerprint, since = excluded.since" if adopt else "NOTHING"),
                   [mine, now])
        return stored_sync(tx)

    stored = await db.transaction(record, durable=True)
    if not matches(secret, stored):
        raise SecretKeyMismatch(
            f"{path} is not the secret.key the database {db.where} was first used with, so the paused runs and "
            "Weixin logins other processes sealed could not be opened here (nor what this process seals, there). "
            "Copy secret.key from the data_dir of a process already using this database and start again. If "
            "the old key is lost or leaked: stop every process, run `qunbot adopt-secret` with this one, and copy "
            "it to the others (what the old key sealed becomes unusable: log Weixin in again)")


def stored_sync(tx: Tx) -> str | None:
    """The fingerprint of the key the database was first used with (None: not recorded yet)."""
    row = tx.execute("SELECT fingerprint FROM install_secret WHERE id = 1").fetchone()
    return None if row is None else str(row[0])
