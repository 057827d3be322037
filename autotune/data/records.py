"""Reading a dataset's records: every format `autotune lengths` takes, and a uniform sample of a large one.

    frame, total = read_sample(Path("train.jsonl"))   # at most SAMPLE_ROWS records, and how many there are

JSON lines and Parquet are read by pyarrow, column by column (10^6 GSM8K-sized records in about 2 s on two
cores); a file pyarrow cannot type (a column that is text in one record and a list in another), JSON arrays
and CSV by pandas. Past SAMPLE_ROWS records the lengths come from a uniform random sample (seeded, so the same
file gives the same figures): a percentile of 50,000 draws sits within a few tenths of a percentile point of
the whole file's, and the limits autotune suggests are rounded up to a multiple of 8 anyway. The report says
when it sampled.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.errors import UserError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["COMPRESSIONS", "FORMATS", "SAMPLE_ROWS", "data_format", "read_records", "read_sample"]

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".zip")  # pandas decompresses these by extension
SAMPLE_ROWS = 50_000  # more records than this: a uniform random sample of this many (module docstring)
SEED = 0
BLOCK_ROWS = 65_536  # Parquet records per block streamed
BLOCK_BYTES = 16 << 20  # JSON lines bytes per block parsed


def data_format(path: Path) -> str:
    """jsonl, json, parquet or csv, from the extension (looking through a compression suffix: .gz, ...)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    suffix = suffixes[-1] if suffixes else ""
    if suffix not in FORMATS:
        raise UserError(
            f"data file '{path}': unknown format {suffix or '(no extension)'!r}; use "
            f"{', '.join(FORMATS)} (optionally compressed: {', '.join(COMPRESSIONS)})"
        )
    return FORMATS[suffix]


def read_records(path: Path) -> pd.DataFrame:
    """Every record of the data file as a DataFrame (UserError: missing, unknown format, unreadable)."""
    frame, _ = read_sample(path, rows=None)
    return frame


def read_sample(path: Path, rows: int | None = SAMPLE_ROWS) -> tuple[pd.DataFrame, int]:
    """At most `rows` records of the file, drawn uniformly (None: all), in file order, and how many records
    the file holds. JSON lines and Parquet stream through in blocks: memory holds the sample and one block."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file '{path}' " + ("is a directory" if path.is_dir() else "does not exist"))
    kind = data_format(path)
    try:
        found = _arrow_sample(path, kind, rows)
        if found is not None:
            frame, total = found
        else:
            frame = _pandas(path, kind)
            total = len(frame)
            if rows is not None and total > rows:
                frame = frame.iloc[np.sort(_keys(total).argsort()[:rows])].reset_index(drop=True)
    except ImportError as exc:  # pandas reads Parquet through pyarrow (or fastparquet)
        raise UserError(f"reading Parquet needs pyarrow: pip install pyarrow ({exc})") from None
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"cannot read '{path}' as {kind}: {reason}") from None
    if frame.empty:
        raise UserError(f"data file '{path}' holds no records")
    return frame, total


def _keys(count: int, start: int = 0) -> np.ndarray:
    """Each record's random key, by its position in the file: the sample is the records with the smallest
    keys, the same whatever the blocks are (a seeded generator per block of positions would not be)."""
    z = (np.arange(start, start + count, dtype=np.uint64) + np.uint64(SEED)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finaliser (wraps)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _arrow_sample(path: Path, kind: str, rows: int | None) -> tuple[pd.DataFrame, int] | None:
    """JSON lines or Parquet streamed block by block, keeping the `rows` records with the smallest keys (a
    uniform sample: reservoir sampling by key); None for what pandas reads (other formats, a zip, a column
    whose type changes between records)."""
    import pyarrow as pa

    batches = _arrow_batches(path, kind)
    if batches is None:
        return None
    kept: list[pa.RecordBatch] = []
    keys: list[np.ndarray] = []
    total = 0
    try:
        for batch in batches:
            kept.append(batch)
            keys.append(_keys(batch.num_rows, total))
            total += batch.num_rows
            if rows is not None and sum(len(k) for k in keys) > 2 * rows:
                kept, keys = _smallest(kept, keys, rows)
        if rows is not None:
            kept, keys = _smallest(kept, keys, rows)
        table = pa.Table.from_batches(kept) if kept else None
    except pa.ArrowException:  # a block's types differ from the first's: pandas reads what it can
        return None
    if table is None:
        import pandas as pd

        return pd.DataFrame(), 0
    return table.to_pandas(), total


def _smallest(batches: list, keys: list[np.ndarray], rows: int) -> tuple[list, list[np.ndarray]]:
    """The `rows` records of smallest key, in file order (the batches are in file order), as one batch."""
    import pyarrow as pa

    if not batches:
        return batches, keys
    all_keys = np.concatenate(keys)
    chosen = np.sort(np.argsort(all_keys, kind="stable")[:rows])
    taken = pa.Table.from_batches(batches).take(pa.array(chosen)).combine_chunks().to_batches()
    return taken, [all_keys[chosen]]


def _arrow_batches(path: Path, kind: str):
    """An iterator of pyarrow RecordBatches over the file, or None where pandas reads it."""
    import pyarrow as pa

    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).iter_batches(batch_size=BLOCK_ROWS)
    if kind != "jsonl" or path.suffix.lower() == ".zip":
        return None
    import pyarrow.json as pj

    try:
        stream = pa.input_stream(str(path), compression="detect")
    except pa.ArrowException:  # a compression this pyarrow lacks: pandas decompresses it
        return None
    return _json_blocks(stream, pj)


def _json_blocks(stream: Any, pj: Any) -> Iterator[Any]:
    """JSON lines parsed BLOCK_BYTES at a time (whole lines), every block with the first block's types: one
    block is what is in memory (pyarrow's own streaming reader kept every block it read)."""
    schema = None
    carried = b""
    with stream:
        while True:
            chunk = stream.read(BLOCK_BYTES)
            data = carried + chunk
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            block, carried = data[:cut], data[cut:]
            if block.strip():
                options = pj.ParseOptions(explicit_schema=schema) if schema is not None else None
                table = pj.read_json(io.BytesIO(block), parse_options=options)
                schema = schema or table.schema
                yield from table.to_batches()
            if not chunk:
                return


def _pandas(path: Path, kind: str) -> pd.DataFrame:
    import pandas as pd

    if kind == "parquet":
        return pd.read_parquet(path)
    if kind == "csv":
        return pd.read_csv(path)
    options = {"dtype": False}  # keep the text as text
    if kind == "jsonl":
        return pd.read_json(path, lines=True, **options)
    try:  # a JSON array of records (or columns) ...
        return pd.read_json(path, **options)
    except ValueError:  # ... or JSON lines named .json
        return pd.read_json(path, lines=True, **options)
