"""hooks/views.compact: which retained views get a dense copy, and that the copy reads the
same (shape, strides, bits)."""
from __future__ import annotations

import numpy as np

import pooch_ext  # noqa: F401
import chainer

from pooch_ext.hooks.chainer_refs import node_array
from pooch_ext.hooks.model_state import base_of
from pooch_ext.hooks.views import compact


def _node(array):
    variable = chainer.Variable(array)
    node = variable.node
    node.retain_data()
    return variable, node


def test_a_dense_view_of_part_of_a_larger_array_gets_a_copy_laid_out_the_same():
    state = np.random.RandomState(0).standard_normal((32, 96)).astype(np.float32)
    for view in (state[:20], np.asfortranarray(state)[:, :40]):
        _, node = _node(view)
        assert compact(node, lambda key: False)
        copy = node_array(node)
        assert copy.base is None and copy.strides == view.strides
        assert copy.tobytes(order="A") == view.tobytes(order="A")


def test_whole_views_strided_views_and_owned_arrays_are_left_alone():
    state = np.arange(32 * 96, dtype=np.float32).reshape(32, 96)
    cases = [(state.reshape(96, 32), lambda key: False),      # a view of all of it
             (state[:, ::2], lambda key: False),              # not dense: its copy would differ
             (state[:20], lambda key: key == id(base_of(state)))]   # the caller's, the model's
    for view, owned in cases:
        _, node = _node(view)
        assert not compact(node, owned)
        assert node_array(node) is view
