"""Networks of the experiments, as trainable Chainer links."""
