"""A small residual CNN for the demo and the executor's exactness tests.

Small enough to train on a CPU (3x32x32 input, 10 classes) yet holding every structure the
planner and the executor must handle: convolution, BatchNormalization, ReLU, max pooling, a
two-branch concat, residual adds, a strided stage, global average pooling, Dropout, Linear.

The full-resolution stage has ``stage1_blocks`` basic residual blocks (two by default) so the
in-core need is spread over many feature maps of the same size, as in real networks: the
smallest budget any plan reaches is then about a third of the in-core need (without them it is
three quarters: the stem's maps and their gradients dominate both), so the demo can train at
40% of in-core memory.
"""
from __future__ import annotations

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext.models._common import global_average_pool


class _BasicBlock(chainer.Chain):
    """conv-BN-ReLU-conv-BN plus the identity, then ReLU."""

    def __init__(self, width: int) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(width, width, 3, 1, 1, nobias=True)
            self.bn1 = L.BatchNormalization(width)
            self.conv2 = L.Convolution2D(width, width, 3, 1, 1, nobias=True)
            self.bn2 = L.BatchNormalization(width)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + x)


class SmallResNet(chainer.Chain):
    def __init__(self, n_classes: int = 10, width: int = 16, dropout: float = 0.25,
                 stage1_blocks: int = 2) -> None:
        super().__init__()
        w = width
        with self.init_scope():
            self.stem = L.Convolution2D(3, w, 3, 1, 1, nobias=True)
            self.stem_bn = L.BatchNormalization(w)
            self.stage1 = chainer.ChainList(*[_BasicBlock(w) for _ in range(stage1_blocks)])
            self.branch_a = L.Convolution2D(w, w // 2, 1, nobias=True)
            self.branch_b = L.Convolution2D(w, w // 2, 3, 1, 1, nobias=True)
            self.mix_bn = L.BatchNormalization(w)
            self.down = L.Convolution2D(w, 2 * w, 3, 2, 1, nobias=True)
            self.down_bn = L.BatchNormalization(2 * w)
            self.res1 = L.Convolution2D(2 * w, 2 * w, 3, 1, 1, nobias=True)
            self.res1_bn = L.BatchNormalization(2 * w)
            self.res2 = L.Convolution2D(2 * w, 2 * w, 3, 1, 1, nobias=True)
            self.res2_bn = L.BatchNormalization(2 * w)
            self.fc = L.Linear(2 * w, n_classes)
        self.dropout = dropout

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.stem_bn(self.stem(x)))                     # 32x32
        for block in self.stage1:
            h = block(h)
        h = F.max_pooling_2d(h, 2, stride=2)                        # 16x16
        mixed = F.concat([self.branch_a(h), self.branch_b(h)])     # concat branch
        h = F.relu(self.mix_bn(mixed) + h)                          # residual add
        h = F.relu(self.down_bn(self.down(h)))                      # 8x8
        r = F.relu(self.res1_bn(self.res1(h)))
        h = F.relu(self.res2_bn(self.res2(r)) + h)                  # residual add
        h = F.dropout(global_average_pool(h), self.dropout)
        return self.fc(h)
