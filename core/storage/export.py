"""The results database's runs exported: flat rows (CSV, Parquet, a pandas DataFrame) whose columns
are declared with the figures in core.storage.metrics (EXPORT_COLUMNS), or the full documents as
JSON. :class:`core.storage.store.ResultStore` hands its runs here (``export_csv``, ``dataframe``...)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from core.base.files import json_text
from core.storage.database import StoreError
from core.storage.metrics import EXPORT_COLUMNS, flat_record

if TYPE_CHECKING:
    from core.storage.store import StoredRun


def records(runs: Sequence[StoredRun]) -> list[dict[str, Any]]:
    """Flat rows (EXPORT_COLUMNS), one per run."""
    return [flat_record(run) for run in runs]


def dataframe(rows: list[dict[str, Any]]) -> Any:
    """A pandas DataFrame of flat rows; needs pandas (``pip install 'core[report]'``)."""
    try:
        import pandas
    except ImportError:
        raise StoreError("a DataFrame needs pandas: pip install 'core[report]'") from None
    frame = pandas.DataFrame.from_records(rows, columns=list(EXPORT_COLUMNS))
    frame["started_at"] = pandas.to_datetime(frame["started_at"], utc=True)
    return frame


def write_csv(output: str | Path | TextIO, rows: list[dict[str, Any]]) -> None:
    """Flat rows as CSV (standard library only), to a file (its folder made) or a stream."""
    if isinstance(output, (str, Path)):
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="", encoding="utf-8") as stream:
            _write_csv(stream, rows)
    else:
        _write_csv(output, rows)


def _write_csv(stream: TextIO, rows: list[dict[str, Any]]) -> None:
    writer = csv.DictWriter(stream, fieldnames=list(EXPORT_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def write_parquet(output: str | Path, rows: list[dict[str, Any]]) -> None:
    """Flat rows as Parquet; needs pyarrow (or pandas with a Parquet engine)."""
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        pyarrow = None
    if pyarrow is not None:
        columns = {name: [row[name] for row in rows] for name in EXPORT_COLUMNS}
        pyarrow.parquet.write_table(pyarrow.table(columns), str(output))
        return
    try:
        dataframe(rows).to_parquet(output)
    except (StoreError, ImportError) as exc:
        raise StoreError(f"Parquet export needs pyarrow: pip install 'core[report]' ({exc})") from None


def write_json(output: TextIO, runs: Sequence[StoredRun]) -> None:
    """The full documents: [{run_id, sweep, cell_key, cell_label, repeat, process_seconds, result}, ...]."""
    documents = [
        {
            "run_id": run.run_id,
            "sweep": run.sweep,
            "cell_key": run.cell_key,
            "cell_label": run.cell_label,
            "repeat": run.repeat,
            "process_seconds": run.process_seconds,
            "result": run.result.model_dump(mode="json"),
        }
        for run in runs
    ]
    output.write(json_text(documents, indent=2) + "\n")  # null, never NaN or Infinity: JSON has neither
