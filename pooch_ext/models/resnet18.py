"""ResNet-18 (He et al. 2016): basic blocks [2, 2, 2, 2], as torchvision defines it.

Two 3x3 convolutions per block with BN; the stride sits on the first convolution of each
stage's first block, with a 1x1 projection shortcut where the shape changes. mu-cuDNN
(papers/mu-cudnn.txt) benchmarks it beside AlexNet; split convolutions (issue 14) compare
with it here. Every convolution without bias, as in torchvision (11,689,512 parameters).
"""
from __future__ import annotations

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import initializers

from pooch_ext.models._common import global_average_pool


class BasicBlock(chainer.Chain):
    """3x3 -> 3x3 with BN; a 1x1 projection shortcut when ``stride`` or the width changes."""

    def __init__(self, in_size: int, out_size: int, stride: int = 1) -> None:
        super().__init__()
        w = initializers.HeNormal()
        self.project = stride != 1 or in_size != out_size
        with self.init_scope():
            self.conv1 = L.Convolution2D(in_size, out_size, 3, stride, 1, initialW=w,
                                         nobias=True)
            self.bn1 = L.BatchNormalization(out_size)
            self.conv2 = L.Convolution2D(out_size, out_size, 3, 1, 1, initialW=w, nobias=True)
            self.bn2 = L.BatchNormalization(out_size)
            if self.project:
                self.conv3 = L.Convolution2D(in_size, out_size, 1, stride, 0, initialW=w,
                                             nobias=True)
                self.bn3 = L.BatchNormalization(out_size)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        shortcut = self.bn3(self.conv3(x)) if self.project else x
        return F.relu(h + shortcut)


class ResNet18(chainer.Chain):
    def __init__(self, n_classes: int = 1000) -> None:
        super().__init__()
        w = initializers.HeNormal()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 64, 7, 2, 3, initialW=w, nobias=True)
            self.bn1 = L.BatchNormalization(64)
            self.stages = chainer.ChainList(*[
                BasicBlock(i, o, s) for i, o, s in
                ((64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1),
                 (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1))])
            self.fc = L.Linear(512, n_classes)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_2d(h, 3, stride=2, pad=1, cover_all=False)
        for block in self.stages.children():
            h = block(h)
        return self.fc(global_average_pool(h))
