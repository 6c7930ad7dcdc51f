"""Opaque keyset cursors: the last id of a page, so pages stay stable while new rows arrive."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from pydantic import BaseModel, ConfigDict

from service.errors import InvalidInput
from service.params import BIGINT_MAX


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"id:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, value = raw.split(":", 1)
        last_id = int(value)
        if prefix != "id" or not 0 <= last_id <= BIGINT_MAX:
            raise ValueError(raw)
        return last_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidInput(f"invalid cursor {cursor!r}: pass back a `next_cursor` from an earlier page") from None


def page_config(item: type[BaseModel]) -> ConfigDict:
    """The OpenAPI example of a page of `item`: the item's own first example and a cursor."""

    def extra(schema: dict[str, Any]) -> None:
        examples = (item.model_config.get("json_schema_extra") or {}).get("examples") or []  # type: ignore[union-attr]
        schema["examples"] = [{"items": examples[:1], "next_cursor": encode_cursor(12)}]

    return ConfigDict(json_schema_extra=extra)
