"""Tables (CSV, Parquet, JSON Lines) -> Parquet shards, streamed.

The reader (this thread) parses one block at a time and casts it to the contract's
schema; a writer thread packs rows into row groups of ``row_group_rows`` and rolls over to
a new ``part-NNNNN.parquet`` shard past ``shard_target_mb``. A bounded queue between them
keeps memory flat whatever the input size. Row-group and shard boundaries depend only on
the row sequence, so the same data always gives byte-identical shards (and the same id).
"""

from __future__ import annotations

import csv
import json
import queue
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3

from trainyard.errors import SourceInvalid, StagingError
from trainyard.progress import Advance
from trainyard.staging.sources import ContractInfo, Source, SourceFile, contract_schema
from trainyard.volumes import ShardInfo

CSV_BLOCK_BYTES = 2 << 20
#: A row must fit one parse block: longer rows are refused, naming the row.
MAX_ROW_BYTES = CSV_BLOCK_BYTES
_TOO_LONG = f"longer than {MAX_ROW_BYTES >> 20} MB, the most one row may hold"
_QUEUE_DEPTH = 3
_DONE = object()


def _pa() -> Any:
    import pyarrow as pa

    return pa


class _HashingSink:
    """A binary file that hashes what is written to it (no second read of the shard)."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._hash = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self._pos = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._fh.write(view)
        self._hash.update(view)
        self._pos += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        self._fh.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
            self.closed = True

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class _ShardWriter:
    """Packs record batches into row groups and shards (runs in the writer thread)."""

    def __init__(self, out_dir: Path, schema: Any, target_bytes: int, row_group_rows: int) -> None:
        self.out_dir = out_dir
        self.schema = schema
        self.target_bytes = target_bytes
        self.row_group_rows = row_group_rows
        self.pending: list[Any] = []
        self.pending_rows = 0
        self.shards: list[ShardInfo] = []
        self.writer: Any = None
        self.sink: Any = None
        self.shard_rows = 0
        self.path: Path | None = None
        self.dictionary_columns = [
            f.name for f in schema if str(f.type) in ("string", "large_string", "binary")
        ]

    def add(self, batch: Any) -> None:
        if batch.num_rows == 0:
            return
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        while self.pending_rows >= self.row_group_rows:
            table = _pa().Table.from_batches(self.pending, schema=self.schema)
            self._write(table.slice(0, self.row_group_rows))
            rest = table.slice(self.row_group_rows)
            self.pending = rest.to_batches() if rest.num_rows else []
            self.pending_rows = rest.num_rows

    def _write(self, table: Any) -> None:
        import pyarrow.parquet as pq

        if self.writer is None:
            self.path = self.out_dir / f"part-{len(self.shards):05d}.parquet"
            self.sink = _HashingSink(self.path)
            self.writer = pq.ParquetWriter(
                self.sink,
                self.schema,
                compression="snappy",
                use_dictionary=self.dictionary_columns,
                write_statistics=True,
            )
            self.shard_rows = 0
        self.writer.write_table(table, row_group_size=self.row_group_rows)
        self.shard_rows += table.num_rows
        if self.sink.tell() >= self.target_bytes:
            self._close_shard()

    def _close_shard(self) -> None:
        self.writer.close()
        self.sink.close()
        assert self.path is not None
        size = self.path.stat().st_size
        if size != self.sink.tell():
            raise OSError(f"{self.path}: wrote {self.sink.tell()} bytes but the file has {size}")
        self.shards.append(
            ShardInfo(
                path=self.path.name, bytes=size, rows=self.shard_rows, hash=self.sink.hexdigest()
            )
        )
        self.writer = self.sink = self.path = None

    def finish(self) -> list[ShardInfo]:
        if self.pending_rows:
            self._write(_pa().Table.from_batches(self.pending, schema=self.schema))
            self.pending, self.pending_rows = [], 0
        if self.writer is not None:
            self._close_shard()
        return self.shards

    def abort(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
                self.sink.close()
            except OSError:
                pass


def _cast_batch(batch: Any, schema: Any, where: str, null_values: tuple[str, ...] = ("",)) -> Any:
    """A batch cast to the contract's schema, every null marker in a text column made null.

    CSV cells are read with the markers as nulls in every type already; JSON Lines and
    Parquet strings equal to a marker become null here, so ``""`` or ``"NA"`` is null
    whatever the source format.
    """
    import pyarrow.compute as pc

    pa = _pa()
    names = set(batch.schema.names)
    missing = [f.name for f in schema if f.name not in names]
    if missing:
        raise SourceInvalid(f"{where}: column {missing[0]!r} of the contract is missing")
    markers = pa.array(null_values, pa.string())
    arrays = []
    for f in schema:
        col = batch.column(f.name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            is_marker = pc.is_in(col, value_set=markers.cast(col.type))
            if pc.any(is_marker).as_py():
                col = pc.if_else(is_marker, pa.scalar(None, col.type), col)
        if col.type != f.type:
            try:
                col = pc.cast(col, f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SourceInvalid(
                    f"{where}: column {f.name!r}: cannot cast {col.type} to contract type "
                    f"{f.type}: {e}"
                ) from e
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _csv_header(src: Source, f: SourceFile) -> list[str]:
    """The header row's names; a quoted name may span lines, as the CSV reader reads it."""
    where = f"{f.path}: row 1 (header)"

    def lines(fh: Any) -> Iterator[str]:
        read = 0
        for line in _bounded_lines(fh):
            read += len(line or b"")
            if line is None or read > MAX_ROW_BYTES:
                raise SourceInvalid(f"{where}: {_TOO_LONG}")
            try:  # a byte order mark (Excel's exports) is no name
                yield line.decode("utf-8-sig" if read == len(line) else "utf-8")
            except UnicodeDecodeError as e:
                raise SourceInvalid(f"{where}: not UTF-8 text ({e.reason})") from e

    with src.fs.open(f.path, "rb") as fh:
        try:
            return next(csv.reader(lines(fh)), [])
        except csv.Error as e:
            raise SourceInvalid(f"{where}: not valid CSV ({e})") from None


def _bounded_lines(fh: Any, limit: int = MAX_ROW_BYTES) -> Iterator[bytes | None]:
    """The lines of a binary file, each at most ``limit`` bytes.

    A longer line yields None and ends the iteration, so a file without newlines never
    fills memory.
    """
    pending = b""
    while True:
        block = fh.read(1 << 20)
        if not block:
            if pending:
                yield pending
            return
        pending += block
        start = 0
        while (cut := pending.find(b"\n", start)) >= 0:
            if cut + 1 - start > limit:
                yield None
                return
            yield pending[start : cut + 1]
            start = cut + 1
        pending = pending[start:]
        if len(pending) > limit:
            yield None
            return


CONTRACT_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
"""A column name a contract can declare (``data_contracts/contract.schema.json``)."""


def _check_unique(columns: list[str], where: str) -> None:
    """Refuse a source naming one column twice: a reader would keep one and drop the other."""
    seen: dict[str, int] = {}
    for i, name in enumerate(columns, 1):
        if name in seen:
            raise SourceInvalid(
                f"{where}: column {name!r} appears twice (columns {seen[name]} and {i}); "
                "each column needs a name of its own"
            )
        seen[name] = i


def _check_extra(columns: list[str], schema: Any, allow_extra: bool, where: str) -> None:
    """Refuse a source column the contract does not declare, unless it allows extras."""
    if allow_extra:
        return
    extra = [c for c in columns if c not in set(schema.names)]
    if extra and not CONTRACT_COLUMN.match(extra[0]):
        raise SourceInvalid(
            f"{where}: column {extra[0]!r} is not in the contract, and no contract can name "
            "it (a column name is letters, digits and _, not starting with a digit): rename "
            "it in the source, or set allow_extra_columns: true to drop it"
        )
    if extra:
        raise SourceInvalid(
            f"{where}: column {extra[0]!r} is not in the contract (allow_extra_columns is "
            "false: declare it, or set allow_extra_columns: true to drop it)"
        )


def _diagnose_csv(src: Source, f: SourceFile, header: list[str], message: str) -> str:
    """Find the row (and column) a pyarrow CSV error is about; only runs on failure."""
    col_idx: int | None = None
    if "In CSV column #" in message:
        try:
            col_idx = int(message.split("In CSV column #", 1)[1].split(":", 1)[0])
        except ValueError:
            col_idx = None
    bad_value = None
    if "invalid value '" in message:
        bad_value = message.split("invalid value '", 1)[1].rsplit("'", 1)[0]
    column = f" column {header[col_idx]!r}" if col_idx is not None and col_idx < len(header) else ""
    with src.fs.open(f.path, "rb") as raw:
        for lineno, line in enumerate(_bounded_lines(raw), start=1):
            if line is None:
                return f"{f.path}: row {lineno}: {_TOO_LONG}"
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"{f.path}: row {lineno}{column}: not UTF-8 text ({e.reason})"
            if lineno == 1:
                continue
            try:
                fields = next(csv.reader([text]), [])
            except csv.Error as e:
                return f"{f.path}: row {lineno}: not valid CSV ({e})"
            if not fields:
                continue
            if len(fields) != len(header):
                return f"{f.path}: row {lineno}: expected {len(header)} columns, got {len(fields)}"
            if col_idx is not None and bad_value is not None and fields[col_idx] == bad_value:
                return f"{f.path}: row {lineno}{column}: {message}"
    return f"{f.path}:{column} {message}"


class _Fields(list):
    """A JSON object's ``(name, value)`` pairs as written, a name given twice included."""


def _diagnose_jsonl(
    src: Source, f: SourceFile, schema: Any, allow_extra: bool, message: str
) -> str:
    """Find the row a pyarrow JSON error is about; only runs on failure."""
    with src.fs.open(f.path, "rb") as raw:
        for lineno, line in enumerate(_bounded_lines(raw), start=1):
            if line is None:
                return f"{f.path}: row {lineno}: {_TOO_LONG}"
            if not line.strip():
                continue
            try:
                row = json.loads(line, object_pairs_hook=_Fields)
            except ValueError as e:
                return f"{f.path}: row {lineno}: not valid JSON Lines ({e})"
            if isinstance(row, _Fields):
                names = [name for name, _ in row]
                try:
                    _check_unique(names, f"{f.path}: row {lineno}")
                    _check_extra(names, schema, allow_extra, f"{f.path}: row {lineno}")
                except StagingError as e:
                    return str(e)
                for name, value in row:
                    field = schema.field(name) if name in schema.names else None
                    if field is not None and not _json_fits(value, field.type):
                        return (
                            f"{f.path}: row {lineno} column {name!r}: {json.dumps(value)[:80]} "
                            f"is not a {field.type} value"
                        )
    # pyarrow counts "row N" from the start of its parse block, not of the file
    return f"{f.path}: not valid JSON Lines for the contract: {_BLOCK_ROW.sub('', message)}"


_BLOCK_ROW = re.compile(r" in row [0-9]+$")


def _json_fits(value: Any, arrow_type: Any) -> bool:
    """Whether pyarrow's JSON reader takes ``value`` for a column of ``arrow_type``."""
    pa = _pa()
    if value is None:
        return True
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return isinstance(value, str)
    if pa.types.is_boolean(arrow_type):
        return isinstance(value, bool)
    if pa.types.is_integer(arrow_type):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_floating(arrow_type):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if pa.types.is_temporal(arrow_type):
        return isinstance(value, str | int) and not isinstance(value, bool)
    return True


def _batches(
    reader: Any,
    stream: Any,
    f: SourceFile,
    schema: Any,
    advance: Advance,
    null_values: tuple[str, ...],
) -> Iterator[Any]:
    """Cast record batches from a streaming reader, reporting bytes read as progress."""
    done = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        pos = stream.tell()
        advance(pos - done, 0)
        done = pos
        yield _cast_batch(batch, schema, f.path, null_values)
    advance(f.size - done, 0)


def _read_csv(
    src: Source,
    f: SourceFile,
    schema: Any,
    advance: Advance,
    allow_extra: bool,
    null_values: tuple[str, ...] = ("",),
) -> Iterator[Any]:
    import pyarrow.csv as pcsv

    pa = _pa()
    header = _csv_header(src, f)
    _check_unique(header, f"{f.path}: row 1 (header)")
    missing = [n for n in schema.names if n not in header]
    if missing:
        spaced = next((h for h in header if h.strip() == missing[0]), None)
        hint = f": the header has {spaced!r}, with spaces around it" if spaced else ""
        raise SourceInvalid(
            f"{f.path}: row 1 (header): column {missing[0]!r} of the contract is missing"
            f"{hint} (header: {', '.join(repr(h) if h != h.strip() else h for h in header)})"
        )
    _check_extra(header, schema, allow_extra, f"{f.path}: row 1 (header)")
    stream = pa.OSFile(f.path, "rb") if src.is_local else src.fs.open(f.path, "rb")
    try:
        reader = pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=True),
            convert_options=pcsv.ConvertOptions(
                column_types=schema,
                include_columns=schema.names,
                check_utf8=True,
                null_values=list(null_values),
                strings_can_be_null=True,
            ),
        )
        yield from _batches(reader, stream, f, schema, advance, null_values)
    except (pa.ArrowException, UnicodeDecodeError) as e:
        raise SourceInvalid(_diagnose_csv(src, f, header, str(e))) from e
    finally:
        stream.close()


def _read_jsonl(
    src: Source,
    f: SourceFile,
    schema: Any,
    advance: Advance,
    allow_extra: bool,
    null_values: tuple[str, ...] = ("",),
) -> Iterator[Any]:
    import pyarrow.json as pjson

    pa = _pa()
    stream = pa.OSFile(f.path, "rb") if src.is_local else src.fs.open(f.path, "rb")
    try:
        reader = pjson.open_json(
            stream,
            read_options=pjson.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=True),
            parse_options=pjson.ParseOptions(
                explicit_schema=schema,
                unexpected_field_behavior="ignore" if allow_extra else "error",
            ),
        )
        yield from _batches(reader, stream, f, schema, advance, null_values)
    except pa.ArrowException as e:
        raise SourceInvalid(_diagnose_jsonl(src, f, schema, allow_extra, str(e))) from e
    finally:
        stream.close()


def _read_parquet(
    src: Source,
    f: SourceFile,
    schema: Any,
    advance: Advance,
    allow_extra: bool,
    null_values: tuple[str, ...] = ("",),
) -> Iterator[Any]:
    import pyarrow.parquet as pq

    pa = _pa()
    stream = pa.OSFile(f.path, "rb") if src.is_local else src.fs.open(f.path, "rb")
    try:
        try:
            pf = pq.ParquetFile(stream)
        except (pa.ArrowException, OSError) as e:
            raise SourceInvalid(f"{f.path}: not a readable Parquet file: {e}") from e
        _check_unique(pf.schema_arrow.names, f.path)
        names = set(pf.schema_arrow.names)
        missing = [n for n in schema.names if n not in names]
        if missing:
            raise SourceInvalid(f"{f.path}: column {missing[0]!r} of the contract is missing")
        _check_extra(pf.schema_arrow.names, schema, allow_extra, f.path)
        per_group = f.size // max(pf.metadata.num_row_groups, 1)
        for i in range(pf.metadata.num_row_groups):
            try:
                table = pf.read_row_group(i, columns=schema.names)
            except (pa.ArrowException, OSError) as e:
                raise SourceInvalid(f"{f.path}: row group {i} is corrupt: {e}") from e
            for batch in table.to_batches():
                yield _cast_batch(batch, schema, f"{f.path} (row group {i})", null_values)
            advance(per_group, 0)
    finally:
        stream.close()


_READERS = {"csv": _read_csv, "jsonl": _read_jsonl, "parquet": _read_parquet}


def stage_table(
    src: Source,
    contract: ContractInfo,
    out_dir: Path,
    *,
    shard_target_mb: int,
    row_group_rows: int,
    advance: Advance,
) -> tuple[list[ShardInfo], Any]:
    """Stream every file of a table source into Parquet shards cast to the contract.

    Args:
        src: The source (CSV, Parquet or JSON Lines files).
        contract: Gives the schema (column names and types).
        out_dir: The private snapshot directory being filled.
        shard_target_mb: Roll over to a new shard past this size.
        row_group_rows: Rows per Parquet row group.
        advance: Progress callback, bytes of source consumed.

    Returns:
        The shards written and the Arrow schema.

    Raises:
        StagingError: Naming file, row and column, for unreadable or ill-typed input, no
            rows, or a write failure (e.g. disk full).
    """
    pa = _pa()
    schema = pa.schema([pa.field(f.name, f.type) for f in contract_schema(contract)])
    writer = _ShardWriter(out_dir, schema, shard_target_mb << 20, row_group_rows)
    q: queue.Queue[Any] = queue.Queue(maxsize=_QUEUE_DEPTH)
    failure: list[BaseException] = []

    def drain() -> None:
        try:
            while (item := q.get()) is not _DONE:
                if not failure:
                    writer.add(item)
            if not failure:
                writer.finish()
        except BaseException as e:  # handed to the reading thread, re-raised there
            failure.append(e)
            while q.get() is not _DONE:
                pass
        finally:
            if failure:
                writer.abort()

    thread = threading.Thread(target=drain, name="parquet-writer", daemon=True)
    thread.start()
    read = _READERS[src.format]
    try:
        for f in src.files:
            if f.size == 0 or failure:
                continue
            for batch in read(
                src, f, schema, advance, contract.allow_extra_columns, contract.null_values
            ):
                if failure:
                    break
                q.put(batch)
            advance(0, 1)
    except BaseException:
        failure.append(StagingError("reader failed"))
        raise
    finally:
        q.put(_DONE)
        thread.join()
    if failure:
        err = failure[0]
        where = writer.path or out_dir
        if isinstance(err, OSError):
            raise StagingError(f"{where}: cannot write shard: {err}") from err
        raise StagingError(f"{where}: writing shards failed: {err}") from err
    if not writer.shards or sum(s.rows for s in writer.shards) == 0:
        raise SourceInvalid(f"{src.url}: source has no data rows")
    return writer.shards, schema


def schema_to_json(schema: Any) -> list[dict[str, Any]]:
    """An Arrow schema as ``[{"name", "type", "nullable"}]`` for the manifest."""
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]
