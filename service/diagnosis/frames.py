"""Large query results straight into DataFrames: COPY to CSV, parsed by pandas' C reader.

At cluster scale a pass reads tens of thousands of rows (a span of a 16,384-GPU job's windows, its ranks'
process snapshots); fetching them as Python tuples costs several times more than this.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import pandas as pd
from sqlalchemy.orm import Session


def copy_frame(
    session: Session,
    query: str,
    params: dict[str, Any],
    *,
    columns: Sequence[str],
    floats: Sequence[str] = (),
    times: Sequence[str] = (),
) -> pd.DataFrame:
    """The rows of `query` (psycopg `%(name)s` parameters) in the session's transaction, as a DataFrame."""
    buffer = io.BytesIO()
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor.copy(f"COPY ({query}) TO STDOUT (FORMAT csv)", params) as copy:
        for chunk in copy:
            buffer.write(chunk)
    if not buffer.getbuffer().nbytes:
        return pd.DataFrame(columns=list(columns))
    buffer.seek(0)
    frame = pd.read_csv(
        buffer, names=list(columns), dtype=dict.fromkeys(floats, "float64"), keep_default_na=False, na_values=[""]
    )
    for column in times:
        frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
    return frame
