"""The IDX header (MNIST's file format), parsed without numpy: the fetch stage checks a
download's header while it streams, the idx reader before it reads a file's body.

Two zero bytes, a type code, the number of dimensions, then one big-endian uint32 per
dimension; the body is the product of the dimensions times the type's size. That product is
computed with Python's integers, so dimensions that would wrap a 64-bit product (4 x 2^32)
give a size that is simply too large, never a small one.
"""

from __future__ import annotations

from pipeline.core.errors import InputError

# Type code -> (numpy dtype string, bytes per value); MNIST uses 0x08 only.
TYPES: dict[int, tuple[str, int]] = {
    0x08: ("u1", 1),
    0x09: ("i1", 1),
    0x0B: (">i2", 2),
    0x0C: (">i4", 4),
    0x0D: (">f4", 4),
    0x0E: (">f8", 8),
}
MAX_DIMS = 8  # MNIST's files have 1 or 3; numpy takes at most 32 (1.x) or 64 (2.x)
MAX_HEADER = 4 + 4 * MAX_DIMS


class IdxError(InputError):
    """An IDX file whose header or length does not describe a valid array."""


def header_size(prefix: bytes, source: str) -> int:
    """The header's length in bytes, from its first 4 bytes (magic and dimension count)."""
    if len(prefix) < 4:
        raise IdxError(f"{source}: {len(prefix)} bytes, too short for an IDX header (4 bytes)")
    if prefix[0] != 0 or prefix[1] != 0 or prefix[2] not in TYPES:
        raise IdxError(
            f"{source}: bad magic number 0x{prefix[:4].hex()}: expected 0x0000 then a type "
            f"code in {sorted(hex(c) for c in TYPES)} (is this a gzip file not unpacked?)"
        )
    ndim = prefix[3]
    if ndim == 0:
        raise IdxError(f"{source}: header declares 0 dimensions")
    if ndim > MAX_DIMS:
        raise IdxError(
            f"{source}: header declares {ndim} dimensions, more than the {MAX_DIMS} an IDX file here may have"
        )
    return 4 + 4 * ndim


def parse_header(data: bytes, source: str) -> tuple[int, tuple[int, ...], int, int]:
    """(type code, shape, header bytes, whole file bytes) from the start of an IDX file."""
    header = header_size(data, source)
    if len(data) < header:
        raise IdxError(f"{source}: truncated header: {data[3]} dimensions need {header} bytes")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(data[3]))
    count = 1
    for dim in shape:
        count *= dim
    return data[2], shape, header, header + count * TYPES[data[2]][1]


def idx_header(code: int, shape: tuple[int, ...]) -> bytes:
    """The header of an IDX file holding an array of type `code` and `shape`: what the bytes
    of a split's images or labels are preceded by in the published files."""
    return bytes([0, 0, code, len(shape)]) + b"".join(int(d).to_bytes(4, "big") for d in shape)
