"""hooks/views.compact: which retained views get a dense copy, and that the copy reads the
same (shape, strides, bits), or, for a strided view, what a swap gives back."""
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


def test_a_strided_slice_gets_the_dense_copy_a_swap_gives_back():
    """A strided view pins its whole base as a dense one does (a channel slice a Mul
    retains: tests/test_later_iterations.py); its copy is the block a swap brings back, the
    same values dense in the order its axes lie (hooks/device.layout_view, empty_like "K")."""
    maps = np.random.RandomState(1).standard_normal((4, 8, 5, 6)).astype(np.float32)
    for view in (maps[:, :3], maps.transpose(0, 2, 3, 1)[:, :, :, 2:5], maps[:, ::2]):
        _, node = _node(view)
        assert compact(node, lambda key: False)
        copy = node_array(node)
        assert copy.base is None and copy.shape == view.shape and np.array_equal(copy, view)
        assert copy.strides == np.empty_like(view, order="K").strides
        assert np.argsort(copy.strides).tolist() == np.argsort(view.strides).tolist()


def test_whole_views_and_owned_arrays_are_left_alone():
    state = np.arange(32 * 96, dtype=np.float32).reshape(32, 96)
    cases = [(state.reshape(96, 32), lambda key: False),      # a view of all of it
             (state[:20], lambda key: key == id(base_of(state)))]   # the caller's, the model's
    for view, owned in cases:
        _, node = _node(view)
        assert not compact(node, owned)
        assert node_array(node) is view
