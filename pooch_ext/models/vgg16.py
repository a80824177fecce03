"""VGG-16 (Simonyan & Zisserman 2015, configuration D) as Chainer's VGG16Layers builds it.

Thirteen 3x3 convolutions in five stages, 2x2 max pooling, three fully connected layers with
dropout; 224x224 input (the fixed fc6 size needs a 7x7 conv5 output). ``width`` divides every
channel count and fully connected size, and ``side`` sets the input the fc6 size is made for
(a multiple of 32): the same topology scaled down, for tests on the CPU device.
"""
from __future__ import annotations

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L

STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


class VGG16(chainer.Chain):
    def __init__(self, n_classes: int = 1000, width: int = 1, side: int = 224) -> None:
        super().__init__()
        if width < 1 or side < 32 or side % 32:
            raise ValueError(f"width must be >= 1 and side a multiple of 32, got {width}, {side}")
        hidden = 4096 // width
        with self.init_scope():
            self.convs = chainer.ChainList()
            in_ch = 3
            for out_ch, count in STAGES:
                for _ in range(count):
                    self.convs.add_link(L.Convolution2D(in_ch, out_ch // width, 3, 1, 1))
                    in_ch = out_ch // width
            self.fc6 = L.Linear(in_ch * (side // 32) ** 2, hidden)
            self.fc7 = L.Linear(hidden, hidden)
            self.fc8 = L.Linear(hidden, n_classes)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        convs = iter(self.convs)
        h = x
        for _, count in STAGES:
            for _ in range(count):
                h = F.relu(next(convs)(h))
            h = F.max_pooling_2d(h, 2, stride=2)
        h = F.dropout(F.relu(self.fc6(h)))
        h = F.dropout(F.relu(self.fc7(h)))
        return self.fc8(h)
