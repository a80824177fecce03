"""The encodings' code (issue 16): a feature map to its encoded form (one flat ``uint8``
array of exactly ``pooch_ext.encodings.encoded_bytes``) and back, on NumPy or CuPy arrays.

Decoding is exact where the encoding is lossless: ``binarize`` gives back the original's
``> 0`` as a bool mask (all ReLU's backward reads; hooks/relu_mask.py runs that backward on
it), ``sparse`` gives back every bit. Both walk the map in the order its elements lie in
memory and give it back laid out the same way (``strides``: Chainer's CPU convolution makes
maps with their axes moved), and work ``CODEC_CHUNK`` elements at a time, so the scratch
beside the two forms stays small. The memory each step takes is ``pooch_ext.encodings``'
(``decoded_bytes``, ``scratch_bytes``; tests/test_encodings.py counts it). Which map may
take which encoding is decided by the planner, never here.
"""
from __future__ import annotations

import math
import time
from typing import Any, Iterator

import numpy as np

from pooch_ext import encodings
from pooch_ext.encodings import mask_bytes

UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _xp(array: Any) -> Any:
    return np if isinstance(array, np.ndarray) else __import__("cupy").get_array_module(array)


def _in_memory_order(xp: Any, array: Any) -> Any:
    """The elements of ``array`` as one flat array in the order they lie in memory: a view
    where the array is dense (any axis order), else a C-ordered copy."""
    if array.flags.c_contiguous:
        return array.reshape(-1)
    if xp is np:
        return array.ravel(order="K")
    return xp.ascontiguousarray(array).reshape(-1)


def _laid_out(flat: Any, shape: tuple, strides: tuple | None) -> Any:
    """``flat`` (memory order) as an array of ``shape`` whose axes lie in memory in the order
    ``strides`` gives (C order without them)."""
    if strides is None or len(strides) != len(shape):
        return flat.reshape(shape)
    order = sorted(range(len(shape)), key=lambda a: (-abs(strides[a]), a))
    return flat.reshape([shape[a] for a in order]).transpose([order.index(a) for a in range(len(order))])


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    step = encodings.CODEC_CHUNK
    for start in range(0, n, step):
        yield start, min(n, start + step)


def nonzero_bits(array: Any) -> Any:
    """Where the elements' bits are not all zero (so -0.0 and NaN count as nonzero)."""
    flat = array.reshape(-1)
    return flat.view(UNSIGNED[array.dtype.itemsize]) != 0


def encode(codec: str, array: Any) -> Any:
    """``array``'s ``codec`` form (a new flat uint8 array; ``array`` is not changed)."""
    xp = _xp(array)
    flat = _in_memory_order(xp, array)
    n = flat.size
    if codec == "fp16":
        return flat.astype(np.float16).view(np.uint8)
    if codec not in ("binarize", "sparse"):
        raise ValueError(f"unknown encoding {codec!r}")
    sparse = codec == "sparse"
    count = int(xp.count_nonzero(flat.view(UNSIGNED[flat.itemsize]))) if sparse else 0
    blob = xp.empty(mask_bytes(n) + count * flat.itemsize, dtype=np.uint8)
    blob[(n + 7) // 8:mask_bytes(n)] = 0
    values = blob[mask_bytes(n):].view(flat.dtype)
    filled = 0
    for start, end in _chunks(n):
        bits = nonzero_bits(flat[start:end]) if sparse else flat[start:end] > 0
        packed = xp.packbits(bits)
        blob[start // 8:start // 8 + packed.size] = packed
        del packed
        if sparse:
            found = flat[start:end][bits]
            values[filled:filled + found.size] = found
            filled += found.size
            del found
        del bits            # before the next chunk's: one chunk's scratch at a time
    return blob


def decode(codec: str, blob: Any, shape: tuple, dtype: Any, strides: tuple | None) -> Any:
    """The array ``encode(codec, array)`` came from (``binarize``: where it was > 0, bool),
    laid out as ``strides`` (the original's) say."""
    xp = _xp(blob)
    dtype = np.dtype(dtype)
    n = math.prod(shape)
    if codec == "binarize":
        return _laid_out(xp.unpackbits(blob[:(n + 7) // 8])[:n].view(bool), shape, strides)
    if codec == "fp16":
        return _laid_out(blob.view(np.float16).astype(dtype), shape, strides)
    if codec != "sparse":
        raise ValueError(f"unknown encoding {codec!r}")
    out = xp.zeros(n, dtype=dtype)
    values = blob[mask_bytes(n):].view(dtype)
    taken = 0
    for start, end in _chunks(n):
        bits = xp.unpackbits(blob[start // 8:(end + 7) // 8])[:end - start].view(bool)
        count = int(xp.count_nonzero(bits))
        out[start:end][bits] = values[taken:taken + count]
        taken += count
        del bits
    return _laid_out(out, shape, strides)


def timed_round_trip(codec: str, array: Any, synchronize: Any = lambda: None
                     ) -> tuple[float, float]:
    """(encode, decode) seconds of ``array`` in ``codec``, per byte of the map: what the
    profile's ``codec_s_per_byte`` holds."""
    synchronize()
    start = time.perf_counter()
    blob = encode(codec, array)
    synchronize()
    middle = time.perf_counter()
    decode(codec, blob, array.shape, array.dtype, array.strides)
    synchronize()
    end = time.perf_counter()
    return (middle - start) / array.nbytes, (end - middle) / array.nbytes
