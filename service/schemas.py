"""From ORM rows to the schemas the API answers with: one way, `Schema.model_validate(row)`.

Every Out schema reads its fields from the row's attributes (`from_attributes=True`). What the row itself
lacks (a job's external id or a node's name that the query joined, a state derived from the clock) travels
beside it in `Joined`, so no schema is filled field by field by hand.

The ORM models have no relationships, so reading attributes never loads rows behind a query's back. An Out
field with a default that no column or given value supplies (IncidentOut's `findings` and `decisions` in
lists) takes its default; a relationship of that name added later would be loaded row by row instead.
"""

from __future__ import annotations

from typing import Any


class Joined:
    """A row and values for the fields it lacks or names otherwise; `Schema.model_validate(Joined(row, ...))`."""

    __slots__ = ("_row", "_values")

    def __init__(self, row: object, /, **values: Any) -> None:
        self._row = row
        self._values = values

    def __getattr__(self, name: str) -> Any:
        # Reached only for names the slots above do not hold: the schema's fields. A given value wins, so a
        # field the row has under another meaning (Decision.job_id, an int key, for the job's external id)
        # is never read from the row.
        if name in self._values:
            return self._values[name]
        return getattr(self._row, name)
