"""Opaque keyset cursors: the last id of a page, so pages stay stable while new rows arrive."""

from __future__ import annotations

import base64
import binascii

from service.errors import InvalidInput


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"id:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, value = raw.split(":", 1)
        if prefix != "id":
            raise ValueError(prefix)
        return int(value)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidInput(f"invalid cursor {cursor!r}: pass back a `next_cursor` from an earlier page") from None
