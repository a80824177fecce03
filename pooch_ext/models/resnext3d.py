"""ResNeXt-101 for video clips (Hara, Kataoka & Satoh, CVPR 2018, "Can spatiotemporal 3D CNNs
retrace the history of 2D CNNs and ImageNet?"), the 3D network of the PoocH paper.

Input 3 x T x H x W (default 3x16x112x112). conv1 7x7x7 with stride (1, 2, 2); 3x3x3 max
pooling with stride 2 and padding 1; bottleneck blocks [3, 4, 23, 3] with cardinality 32
(grouped 3x3x3 convolutions through ``L.ConvolutionND(groups=32)``), expansion 2, type-B
(projection) shortcuts, stride 2 in every dimension from the second stage on; global average
pooling (Hara's AvgPool3d over the last map) and a linear classifier (400 Kinetics classes).
"""
from __future__ import annotations

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import initializers

from pooch_ext.models._common import global_average_pool

CARDINALITY = 32
EXPANSION = 2
LAYERS = (3, 4, 23, 3)


def _conv(in_ch: int, out_ch: int, ksize, stride=1, pad=0, groups: int = 1) -> L.ConvolutionND:
    return L.ConvolutionND(3, in_ch, out_ch, ksize, stride, pad, nobias=True, groups=groups,
                           initialW=initializers.HeNormal())


class ResNeXtBottleneck3D(chainer.Chain):
    def __init__(self, in_ch: int, planes: int, stride: int = 1, project: bool = False) -> None:
        super().__init__()
        mid = CARDINALITY * (planes // 32)
        out = planes * EXPANSION
        with self.init_scope():
            self.conv1 = _conv(in_ch, mid, 1)
            self.bn1 = L.BatchNormalization(mid)
            self.conv2 = _conv(mid, mid, 3, stride, 1, groups=CARDINALITY)
            self.bn2 = L.BatchNormalization(mid)
            self.conv3 = _conv(mid, out, 1)
            self.bn3 = L.BatchNormalization(out)
            if project:
                self.down = _conv(in_ch, out, 1, stride)
                self.down_bn = L.BatchNormalization(out)
        self.project = project

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        shortcut = self.down_bn(self.down(x)) if self.project else x
        return F.relu(h + shortcut)


class ResNeXt101_3D(chainer.Chain):
    def __init__(self, n_classes: int = 400) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = _conv(3, 64, 7, (1, 2, 2), 3)
            self.bn1 = L.BatchNormalization(64)
            self.stages = chainer.ChainList()
            in_ch = 64
            for index, (planes, blocks) in enumerate(zip((128, 256, 512, 1024), LAYERS)):
                stage = chainer.ChainList()
                stride = 1 if index == 0 else 2
                for b in range(blocks):
                    project = b == 0 and (stride != 1 or in_ch != planes * EXPANSION)
                    stage.add_link(ResNeXtBottleneck3D(in_ch, planes, stride if b == 0 else 1,
                                                       project))
                    in_ch = planes * EXPANSION
                self.stages.add_link(stage)
            self.fc = L.Linear(in_ch, n_classes)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_nd(h, 3, stride=2, pad=1, cover_all=False)
        for stage in self.stages:
            for block in stage:
                h = block(h)
        return self.fc(global_average_pool(h))
