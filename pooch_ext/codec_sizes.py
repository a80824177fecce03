"""The memory Gist's codecs take (issue 16; pooch_ext/encodings.py decides which map takes
which): the encoded form, the map a decode gives back, and the scratch beside them while
encoding and decoding. hooks/codecs.py allocates exactly this (tests/test_encodings.py
counts it with the CPU device's allocator); the planner charges it.
"""
from __future__ import annotations

from pooch_ext.errors import PoochError

LOSSLESS = ("binarize", "sparse")
LOSSY = ("fp16", "fp8")
CODECS = LOSSLESS + LOSSY
# elements hooks/codecs.py encodes and decodes at once (a multiple of 8: whole mask bytes)
CODEC_CHUNK = 1 << 22
FP8_CONSTANTS = 64       # bytes beyond its work arrays fp8 may take (0-d constants)


def mask_bytes(n: int) -> int:
    """Bytes of a one-bit-per-element mask, padded to 8 bytes so the values after it are
    aligned for any dtype."""
    return (int(n) + 63) // 64 * 8


def encoded_bytes(codec: str, n: int, itemsize: int, nonzero: int) -> int:
    """Bytes of ``codec``'s form of ``n`` elements of ``itemsize`` bytes, ``nonzero`` of
    them nonzero."""
    if codec == "binarize":
        return mask_bytes(n)
    if codec == "sparse":
        return mask_bytes(n) + int(nonzero) * int(itemsize)
    if codec in LOSSY:
        return (2 if codec == "fp16" else 1) * int(n)
    raise PoochError(f"unknown encoding {codec!r}; known: {', '.join(CODECS)}")


def unpacked_bytes(n: int) -> int:
    """Bytes of a mask unpacked to one byte per element (``unpackbits`` of whole bytes)."""
    return (int(n) + 7) // 8 * 8


def decoded_bytes(codec: str, n: int, itemsize: int) -> int:
    """Bytes of the map ``codec`` gives back for backward: a binarized map's unpacked mask
    (all ReLU's backward reads), else the map itself."""
    return unpacked_bytes(n) if codec == "binarize" else int(n) * int(itemsize)


def scratch_bytes(codec: str, n: int, itemsize: int, nonzero: int) -> tuple[int, int]:
    """(encode, decode) scratch beyond the forms at their peak, as hooks/codecs.py allocates
    it, one chunk of ``CODEC_CHUNK`` elements at a time: encoding, the chunk's one-byte mask
    beside its packed bits or (sparse) its gathered values; decoding a sparse map, the
    chunk's unpacked mask (a binarized map's unpacked mask is its decoded form). Exact for a
    map of one chunk; for more, the values of one chunk are bounded by all of them."""
    chunk = min(int(n), CODEC_CHUNK)
    if codec == "fp16":
        return 0, 0
    if codec == "fp8":
        # three uint32 work arrays of a chunk, and the few bytes NumPy takes for the
        # constants its bit operations are given
        return 12 * chunk + FP8_CONSTANTS, 12 * chunk + FP8_CONSTANTS
    if codec == "binarize":
        return chunk + (chunk + 7) // 8, 0
    gathered = min(int(nonzero), chunk) * int(itemsize)
    return chunk + max((chunk + 7) // 8, gathered), unpacked_bytes(chunk)
