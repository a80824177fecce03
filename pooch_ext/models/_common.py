"""Pieces shared by the networks."""
from __future__ import annotations

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F


def global_average_pool(h: chainer.Variable) -> chainer.Variable:
    """Average over every spatial axis with one window covering the whole map.

    The window is taken from the input's shape (as Chainer's own ResNet50Layers does), so the
    network runs at any input size; the analytic rescaler recognises such a pooling (window
    equal to its input, output 1 everywhere) and keeps it global at other sizes.
    """
    spatial = h.shape[2:]
    if len(spatial) == 2:
        return F.average_pooling_2d(h, spatial, stride=1)
    return F.average_pooling_nd(h, spatial, stride=1)
