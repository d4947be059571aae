"""Rows of a ``COPY … TO STDOUT (FORMAT binary)`` decoded into Arrow arrays a column at a time,
by numpy and Arrow kernels: no Python object per value.

PostgreSQL sends each row of a binary COPY as a 16-bit field count, then per field a 32-bit
length (-1: NULL) and that many bytes in the type's binary form (big-endian integers and
floats, timestamps as microseconds since 2000-01-01, text as its bytes in the client
encoding). The reader records where each row begins as the rows arrive (one message each); from
those, every field's position is found for all rows at once, column after column, and the last
column's end must land on the next row's start — a row that does not decode exactly fails the
chunk instead of being archived wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
HEADER = len(SIGNATURE) + 8  # the signature, a flags field and the header extension's length
TRAILER = b"\xff\xff"  # the field count -1 that ends the stream
PAD = 8  # zero bytes after a block, so the gather of a NULL in the last field stays inside it

_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
_EPOCH_DAYS = 10_957  # 2000-01-01 in Unix days

# kind: (the SQL type the column is returned as, its big-endian numpy type, the Arrow type)
FIXED: dict[str, tuple[str, str, pa.DataType]] = {
    "int2": ("int2", ">i2", pa.int16()),
    "int4": ("int4", ">i4", pa.int32()),
    "int8": ("int8", ">i8", pa.int64()),
    "float4": ("float4", ">f4", pa.float32()),
    "float8": ("float8", ">f8", pa.float64()),
    "bool": ("bool", "u1", pa.bool_()),
    "date": ("date", ">i4", pa.date32()),
    "time": ("time", ">i8", pa.time64("us")),
    "timestamp": ("timestamp", ">i8", pa.timestamp("us")),
    "timestamptz": ("timestamptz", ">i8", pa.timestamp("us", tz="UTC")),
}
VARIABLE = {"text": pa.string(), "bytea": pa.binary()}
# PostgreSQL's infinities: no Parquet timestamp or date holds them
_INFINITE = {
    "date": (np.iinfo(np.int32).min, np.iinfo(np.int32).max),
    "timestamp": (np.iinfo(np.int64).min, np.iinfo(np.int64).max),
    "timestamptz": (np.iinfo(np.int64).min, np.iinfo(np.int64).max),
}


def kind_of(arrow: pa.DataType) -> str | None:
    """The binary kind that reads a column kept as ``arrow`` (None: read it as text)."""
    for kind, (_, _, t) in FIXED.items():
        if arrow == t:
            return kind
    for kind, t in VARIABLE.items():
        if arrow == t:
            return kind
    return None


def _gather(buf: np.ndarray, at: np.ndarray, dtype: str) -> np.ndarray:
    """The value of ``dtype`` (big-endian) at each offset ``at`` of ``buf``, in native order."""
    kind = np.dtype(dtype)
    raw = np.empty((len(at), kind.itemsize), dtype=np.uint8)
    for k in range(kind.itemsize):  # a byte of every value at a time: no index array per byte
        np.take(buf, at + k, out=raw[:, k])
    return raw.view(kind).ravel().astype(kind.newbyteorder("="))


def _fixed(kind: str, buf: np.ndarray, data: np.ndarray, length, null) -> pa.Array:
    _, dtype, arrow = FIXED[kind]
    width = np.dtype(dtype).itemsize
    if np.any(length[~null] != width):
        raise ValueError(f"a {kind} field of another width than {width} bytes in the COPY")
    values = _gather(buf, data, dtype)
    if kind in _INFINITE:
        low, high = _INFINITE[kind]
        if np.any(((values == low) | (values == high)) & ~null):
            raise ValueError(f"an infinite {kind} cannot be archived in Parquet")
    if kind == "bool":
        return pa.array(values != 0, pa.bool_(), mask=null)
    if kind == "date":
        return pa.array(values + _EPOCH_DAYS, pa.int32(), mask=null).view(arrow)
    if kind in ("timestamp", "timestamptz"):
        return pa.array(values + _EPOCH_US, pa.int64(), mask=null).view(arrow)
    if kind == "time":
        return pa.array(values, pa.int64(), mask=null).view(arrow)
    return pa.array(values, arrow, mask=null)


def _variable(kind: str, whole: pa.Buffer, data: np.ndarray, end: np.ndarray, null) -> pa.Array:
    """The values between ``data`` and ``end`` of each row, copied out by one Arrow ``take``
    over an array whose even entries are the values and odd entries the bytes between them."""
    n = len(data)
    offsets = np.empty(2 * n + 1, dtype=np.int64)
    offsets[0 : 2 * n : 2] = data
    offsets[1 : 2 * n : 2] = end
    offsets[2 * n] = end[-1]
    interleaved = pa.Array.from_buffers(
        pa.large_binary(), 2 * n, [None, pa.py_buffer(offsets), whole]
    )
    picked = interleaved.take(pa.array(np.arange(0, 2 * n, 2), pa.int64(), mask=null))
    return picked.cast(VARIABLE[kind])  # text: its UTF-8 checked here


def decode(block: bytearray, starts: Sequence[int], kinds: Sequence[str]) -> list[pa.Array]:
    """The columns of the rows of ``block`` (whole rows of a binary COPY, without its header
    or trailer) beginning at ``starts``, one Arrow array per kind. ``block`` is extended by
    ``PAD`` zero bytes. Raises ``ValueError`` for a row that does not decode exactly."""
    end_of_rows = len(block)
    block += bytes(PAD)
    buf = np.frombuffer(block, dtype=np.uint8)
    whole = pa.py_buffer(block)
    first = np.asarray(starts, dtype=np.int64)
    if np.any(_gather(buf, first, ">i2") != len(kinds)):
        raise ValueError(f"a row of the COPY without its {len(kinds)} fields")
    at = first + 2
    arrays = []
    for kind in kinds:
        length = _gather(buf, at, ">i4")
        null = length < 0
        data = at + 4
        at = data + np.maximum(length, 0)
        if kind in FIXED:
            arrays.append(_fixed(kind, buf, data, length, null))
        else:
            arrays.append(_variable(kind, whole, data, at, null))
    if np.any(at != np.append(first[1:], end_of_rows)):
        raise ValueError("a row of the COPY does not end where the next begins")
    return arrays
