"""The encodings' code (issue 16): a feature map to its encoded form (one flat ``uint8``
array of exactly ``pooch_ext.codec_sizes.encoded_bytes``) and back, on NumPy or CuPy arrays.

Decoding is exact where the encoding is lossless: ``binarize`` gives back the original's
``> 0`` as a bool mask (all ReLU's backward reads; hooks/relu_mask.py runs that backward on
it), ``sparse`` gives back every bit. Both walk the map in the order its elements lie in
memory and give it back laid out the same way (``strides``: Chainer's CPU convolution makes
maps with their axes moved), and work ``CODEC_CHUNK`` elements at a time, so the scratch
beside the two forms stays small. The memory each step takes is ``pooch_ext.codec_sizes``'
(``decoded_bytes``, ``scratch_bytes``; tests/test_encodings.py counts it). Which map may
take which encoding is decided by the planner, never here.
"""
from __future__ import annotations

import math
import time
from typing import Any, Iterator

import numpy as np

from pooch_ext import codec_sizes
from pooch_ext.codec_sizes import mask_bytes
from pooch_ext.hooks.device import laid_out

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


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    step = codec_sizes.CODEC_CHUNK
    for start in range(0, n, step):
        yield start, min(n, start + step)


def nonzero_bits(array: Any) -> Any:
    """Where the elements' bits are not all zero (so -0.0 and NaN count as nonzero)."""
    flat = array.reshape(-1)
    return flat.view(UNSIGNED[array.dtype.itemsize]) != 0


# fp8 (Gist's DPR at 8 bits): 1 sign, 4 exponent (bias 7), 3 mantissa bits; round to
# nearest even, no denormals (exponent 0 is zero), clamped at +-480 (inf and NaN too)
_FP8_BIAS_GAP = 127 - 7           # float32's exponent bias minus fp8's


def _fp8_work(xp: Any, size: int) -> tuple[Any, Any, Any]:
    return tuple(xp.empty(size, dtype=np.uint32) for _ in range(3))


def _to_fp8(xp: Any, chunk: Any, out: Any, work: tuple) -> None:
    """``chunk`` (floats) as fp8 codes into ``out`` (uint8), in place in ``work``."""
    a, b, c = (w[:chunk.size] for w in work)
    a.view(np.float32)[...] = chunk                  # float32 bits (a cast for other floats)
    xp.right_shift(a, 24, out=c)
    xp.bitwise_and(c, 0x80, out=c)                   # the sign, kept in c until the end
    xp.bitwise_and(a, 0x7FFFFFFF, out=a)             # magnitude, then round at mantissa bit 3
    xp.right_shift(a, 20, out=b)
    xp.bitwise_and(b, 1, out=b)
    xp.add(a, 0x7FFFF, out=a)
    xp.add(a, b, out=a)
    xp.right_shift(a, 23, out=b)                     # exponent, clipped to fp8's 0..16
    xp.clip(b, _FP8_BIAS_GAP, _FP8_BIAS_GAP + 16, out=b)
    xp.subtract(b, _FP8_BIAS_GAP, out=b)
    xp.right_shift(a, 20, out=a)                     # mantissa, none where the exponent is 0
    xp.bitwise_and(a, 7, out=a)
    xp.left_shift(b, 3, out=b)
    xp.minimum(a, b, out=a)                          # (b is 8 or more unless the exponent is 0)
    xp.bitwise_or(a, b, out=a)
    xp.minimum(a, 0x7F, out=a)                       # exponent 16: the largest code
    xp.bitwise_or(a, c, out=a)
    out[...] = a


def _from_fp8(xp: Any, codes: Any, out: Any, work: tuple) -> None:
    """fp8 ``codes`` (uint8) as floats into ``out``, in place in ``work``."""
    a, b, c = (w[:codes.size] for w in work)
    a[...] = codes
    xp.bitwise_and(a, 0x80, out=b)
    xp.left_shift(b, 24, out=b)                      # the sign
    xp.bitwise_and(a, 0x7F, out=a)
    xp.minimum(a, 1, out=c)                          # nonzero: a bias to add
    xp.multiply(c, _FP8_BIAS_GAP << 23, out=c)
    xp.left_shift(a, 20, out=a)
    xp.add(a, c, out=a)
    xp.bitwise_or(a, b, out=a)
    out[...] = a.view(np.float32)


def encode(codec: str, array: Any) -> Any:
    """``array``'s ``codec`` form (a new flat uint8 array; ``array`` is not changed)."""
    xp = _xp(array)
    flat = _in_memory_order(xp, array)
    n = flat.size
    if codec == "fp16":
        return flat.astype(np.float16).view(np.uint8)
    if codec == "fp8":
        blob = xp.empty(n, dtype=np.uint8)
        work = _fp8_work(xp, min(n, codec_sizes.CODEC_CHUNK))
        for start, end in _chunks(n):
            _to_fp8(xp, flat[start:end], blob[start:end], work)
        return blob
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
        return laid_out(xp.unpackbits(blob[:(n + 7) // 8])[:n].view(bool), shape, strides)
    if codec == "fp16":
        return laid_out(blob.view(np.float16).astype(dtype), shape, strides)
    if codec == "fp8":
        out = xp.empty(n, dtype=dtype)
        work = _fp8_work(xp, min(n, codec_sizes.CODEC_CHUNK))
        for start, end in _chunks(n):
            _from_fp8(xp, blob[start:end], out[start:end], work)
        return laid_out(out, shape, strides)
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
    return laid_out(out, shape, strides)


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
