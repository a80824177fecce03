"""The encodings' code (issue 16): a feature map to its encoded form (one flat ``uint8``
array of exactly ``pooch_ext.encodings.encoded_bytes``) and back, on NumPy or CuPy arrays.

Decoding is exact where the encoding is lossless: ``binarize`` gives back the original's
``> 0`` as a bool mask (all ReLU's backward reads; hooks/relu_mask.py runs that backward on
it), ``sparse`` gives back every bit. The memory each step takes is
``pooch_ext.encodings``' (``decoded_bytes``, ``scratch_bytes``; tests/test_encodings.py
measures it). Which map may take which encoding is decided by the planner, never here.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from pooch_ext.encodings import mask_bytes

UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _xp(array: Any) -> Any:
    return np if isinstance(array, np.ndarray) else __import__("cupy").get_array_module(array)


def _mask(xp: Any, bits: Any) -> Any:
    """``bits`` (bool, flat) packed 8 to a byte, padded to ``mask_bytes``."""
    packed = xp.packbits(bits)
    out = xp.zeros(mask_bytes(bits.size), dtype=np.uint8)
    out[:packed.size] = packed
    return out


def _unmask(xp: Any, blob: Any, n: int) -> Any:
    """The first ``n`` bits of ``blob`` as bools: a view of the unpacked bytes, no copy."""
    return xp.unpackbits(blob[:(n + 7) // 8])[:n].view(bool)


def nonzero_bits(array: Any) -> Any:
    """Where the elements' bits are not all zero (so -0.0 and NaN count as nonzero)."""
    flat = array.reshape(-1)
    return flat.view(UNSIGNED[array.dtype.itemsize]) != 0


def encode(codec: str, array: Any) -> Any:
    """``array``'s ``codec`` form (a new flat uint8 array; ``array`` is not changed)."""
    xp = _xp(array)
    array = xp.ascontiguousarray(array)
    if codec == "binarize":
        return _mask(xp, (array > 0).reshape(-1))
    if codec == "sparse":
        where = nonzero_bits(array)
        values = array.reshape(-1)[where]
        return xp.concatenate([_mask(xp, where), values.view(np.uint8)])
    if codec == "fp16":
        return array.astype(np.float16).reshape(-1).view(np.uint8)
    raise ValueError(f"unknown encoding {codec!r}")


def decode(codec: str, blob: Any, shape: tuple, dtype: Any) -> Any:
    """The array ``encode(codec, array)`` came from (``binarize``: where it was > 0, bool)."""
    xp = _xp(blob)
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if codec == "binarize":
        return _unmask(xp, blob, n).reshape(shape)
    if codec == "sparse":
        where = _unmask(xp, blob, n)
        out = xp.zeros(n, dtype=dtype)
        out[where] = blob[mask_bytes(n):].view(dtype)
        return out.reshape(shape)
    if codec == "fp16":
        return blob.view(np.float16).astype(dtype).reshape(shape)
    raise ValueError(f"unknown encoding {codec!r}")


def timed_round_trip(codec: str, array: Any, synchronize: Any = lambda: None
                     ) -> tuple[float, float]:
    """(encode, decode) seconds of ``array`` in ``codec``, per byte of the map: what the
    profile's ``codec_s_per_byte`` holds."""
    synchronize()
    start = time.perf_counter()
    blob = encode(codec, array)
    synchronize()
    middle = time.perf_counter()
    decode(codec, blob, array.shape, array.dtype)
    synchronize()
    end = time.perf_counter()
    return (middle - start) / array.nbytes, (end - middle) / array.nbytes
