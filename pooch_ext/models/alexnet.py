"""AlexNet (Krizhevsky et al. 2012) as in Chainer's ImageNet example (examples/imagenet/alex.py).

Single-tower variant with local response normalisation, 227x227 input, dropout on fc6/fc7.
The fully connected layers have fixed sizes, so the network needs an input whose conv5
output is 6x6 (227x227, as in the original). ``width`` divides every channel count and fully
connected size: the same topology scaled down, for tests on the CPU device.
"""
from __future__ import annotations

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L


class AlexNet(chainer.Chain):
    def __init__(self, n_classes: int = 1000, width: int = 1) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        c1, c2, c3, c5, hidden = (n // width for n in (96, 256, 384, 256, 4096))
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, c1, 11, stride=4)
            self.conv2 = L.Convolution2D(c1, c2, 5, pad=2)
            self.conv3 = L.Convolution2D(c2, c3, 3, pad=1)
            self.conv4 = L.Convolution2D(c3, c3, 3, pad=1)
            self.conv5 = L.Convolution2D(c3, c5, 3, pad=1)
            self.fc6 = L.Linear(c5 * 6 * 6, hidden)
            self.fc7 = L.Linear(hidden, hidden)
            self.fc8 = L.Linear(hidden, n_classes)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.max_pooling_2d(F.local_response_normalization(F.relu(self.conv1(x))), 3, stride=2)
        h = F.max_pooling_2d(F.local_response_normalization(F.relu(self.conv2(h))), 3, stride=2)
        h = F.relu(self.conv3(h))
        h = F.relu(self.conv4(h))
        h = F.max_pooling_2d(F.relu(self.conv5(h)), 3, stride=2)
        h = F.dropout(F.relu(self.fc6(h)))
        h = F.dropout(F.relu(self.fc7(h)))
        return self.fc8(h)
