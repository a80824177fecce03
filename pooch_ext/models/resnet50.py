"""ResNet-50 (He et al. 2016) as in Chainer's ImageNet example (examples/imagenet/resnet50.py).

Bottleneck blocks [3, 4, 6, 3]; the stride sits on the first 1x1 convolution of each stage's
first block and on its projection shortcut, as in the Caffe model the example follows.
Max pooling uses Chainer's default ``cover_all=True`` (112 -> 56 with a 3x3, stride-2 window).
"""
from __future__ import annotations

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import initializers

from pooch_ext.models._common import global_average_pool


class BottleNeck(chainer.Chain):
    """1x1 -> 3x3 -> 1x1 with BN; a projection shortcut when ``project`` is set."""

    def __init__(self, in_size: int, ch: int, out_size: int, stride: int = 1,
                 project: bool = False, groups: int = 1) -> None:
        super().__init__()
        w = initializers.HeNormal()
        with self.init_scope():
            self.conv1 = L.Convolution2D(in_size, ch, 1, stride, 0, initialW=w, nobias=True)
            self.bn1 = L.BatchNormalization(ch)
            self.conv2 = L.Convolution2D(ch, ch, 3, 1, 1, initialW=w, nobias=True, groups=groups)
            self.bn2 = L.BatchNormalization(ch)
            self.conv3 = L.Convolution2D(ch, out_size, 1, 1, 0, initialW=w, nobias=True)
            self.bn3 = L.BatchNormalization(out_size)
            if project:
                self.conv4 = L.Convolution2D(in_size, out_size, 1, stride, 0, initialW=w,
                                             nobias=True)
                self.bn4 = L.BatchNormalization(out_size)
        self.project = project

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        shortcut = self.bn4(self.conv4(x)) if self.project else x
        return F.relu(h + shortcut)


class Block(chainer.ChainList):
    """One stage: a projecting block, then ``layers - 1`` identity blocks."""

    def __init__(self, layers: int, in_size: int, ch: int, out_size: int, stride: int = 2) -> None:
        super().__init__()
        self.add_link(BottleNeck(in_size, ch, out_size, stride, project=True))
        for _ in range(layers - 1):
            self.add_link(BottleNeck(out_size, ch, out_size))

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        for link in self.children():
            x = link(x)
        return x


class ResNet50(chainer.Chain):
    def __init__(self, n_classes: int = 1000) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 64, 7, 2, 3, initialW=initializers.HeNormal())
            self.bn1 = L.BatchNormalization(64)
            self.res2 = Block(3, 64, 64, 256, 1)
            self.res3 = Block(4, 256, 128, 512)
            self.res4 = Block(6, 512, 256, 1024)
            self.res5 = Block(3, 1024, 512, 2048)
            self.fc = L.Linear(2048, n_classes)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = self.bn1(self.conv1(x))
        h = F.max_pooling_2d(F.relu(h), 3, stride=2)
        h = self.res5(self.res4(self.res3(self.res2(h))))
        return self.fc(global_average_pool(h))
