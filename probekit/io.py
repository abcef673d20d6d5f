"""Result files: Parquet written in row groups to a temporary name and renamed when complete."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


class ParquetStream:
    """Append DataFrames as row groups; the file appears under its name only once closed cleanly.

    Memory stays flat however many rows pass through, and a failure leaves no half-written file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        self._writer: pq.ParquetWriter | None = None

    def write(self, frame: pd.DataFrame) -> None:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.tmp, table.schema)
        self._writer.write_table(table.cast(self._writer.schema))

    def __enter__(self) -> ParquetStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._writer is not None:
            self._writer.close()
        if exc_type is None and self._writer is not None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
