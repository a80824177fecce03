"""Profile contract: builder semantics, save/load round trip, clear errors on bad folders."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from pooch_ext.errors import ProfileError
from pooch_ext.links import get_link
from pooch_ext.profile import Profile


def test_builder_classifies_tensors_by_backward_need(toy_profile):
    t = toy_profile.tensors.set_index("tensor")
    assert list(t.kind[:2]) == ["input", "input"]
    # stem conv output is retained by BN; BN output is not retained (ReLU keeps its output)
    assert t.kind[2] == "feature_map" and t.kind[3] == "intermediate"
    # the two branch convs' outputs feed Concat, which retains nothing
    assert t.kind[5] == t.kind[6] == "intermediate"
    assert set(toy_profile.feature_maps.tensor) == {2, 4, 10, 11}


def test_backward_ops_follow_reverse_order_and_needs(toy_profile):
    bwd = toy_profile.backward_ops
    assert list(bwd.fwd_op) == sorted(bwd.fwd_op, reverse=True)
    relu_bwd = bwd[bwd.name == "ReLU"].iloc[0]
    assert relu_bwd.needs == [4]
    assert toy_profile.ops.phase.iloc[-1] == "update"


def test_recompute_chain_reaches_through_intermediates(toy_profile):
    t = toy_profile.tensors.set_index("tensor")
    # the pooled map (10) is rebuilt from the ReLU output: pool <- dropout <- add <- concat <- convs
    assert t.recompute_ops[10] == [3, 4, 5, 6, 7, 8]
    assert t.recompute_sources[10] == [4]
    assert t.can_recompute[10]
    assert t.recompute_s[10] == pytest.approx(8e-4 * 2 + 4e-4)


def test_memory_balances_and_incore_peak(toy_profile):
    curve = toy_profile.memory_curve()
    assert curve[-1] == toy_profile.resident_bytes  # everything allocated is freed
    assert toy_profile.incore_peak_bytes >= toy_profile.resident_bytes + toy_profile.feature_map_bytes


def _embedding_sum(gradient_bytes: list[int]):
    """An embedding's output summed over the sequence: the sum's backward hands the
    embedding a gradient that may hold fewer bytes than its shape (a broadcast view)."""
    from pooch_ext.builder import ProfileBuilder
    from pooch_ext.profile import Device

    b = ProfileBuilder(Device("toy", 1 << 30), get_link("pcie3"))
    x = b.input((64, 30), "int32")
    (e,) = b.forward("EmbedIDFunction", [x], [((64, 30, 64), "float32")], 1e-4, 1e-4,
                     retain_inputs=[0], output_gradient_bytes=gradient_bytes)
    (h,) = b.forward("Sum", [e], [((64, 64), "float32")], 1e-4, 1e-4)
    b.forward("SoftmaxCrossEntropy", [h], [((), "float32")], 1e-4, 1e-4, retain_inputs=[0])
    return b.build()


def test_a_gradient_measured_smaller_than_its_shape_holds_only_its_bytes():
    def gradients(profile) -> list[int]:
        events = profile.memory[profile.memory["category"] == "gradient"]
        return events[events["kind"] == "malloc"]["bytes"].tolist()

    dense, view = _embedding_sum([]), _embedding_sum([64 * 64 * 4])
    assert sum(gradients(dense)) - sum(gradients(view)) == 64 * 30 * 64 * 4 - 64 * 64 * 4
    assert view.memory_curve()[-1] == view.resident_bytes            # still balanced
    # measured larger than its shape (a view of a bigger array) never counts more
    assert gradients(_embedding_sum([1 << 30])) == gradients(dense)


def test_round_trip_is_equal(toy_profile, tmp_path):
    toy_profile.save(tmp_path / "p")
    again = Profile.load(tmp_path / "p")
    assert again == toy_profile
    assert again.summary() == toy_profile.summary()


def test_with_link_rescales_swap_times(toy_profile):
    fast = toy_profile.with_link(get_link("nvlink2"))
    assert (fast.tensors.swap_out_s < toy_profile.tensors.swap_out_s).all()
    assert fast.link.name == "nvlink2" and fast.ops.equals(toy_profile.ops)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "ops.csv").unlink(), "ops.csv: missing"),
    (lambda d: (d / "profile.json").write_text("{"), "profile.json: not valid JSON"),
    (lambda d: (d / "tensors.csv").write_text(""), "tensors.csv: empty file"),
])
def test_damaged_folder_names_the_file(toy_profile, tmp_path, damage, message):
    toy_profile.save(tmp_path)
    damage(tmp_path)
    with pytest.raises(ProfileError, match=message.replace(".", r"\.")):
        Profile.load(tmp_path)


def save_with(profile, folder, table, change):
    """Save ``profile``, then rewrite ``table``.csv as ``change`` makes it (cells as text)."""
    profile.save(folder)
    path = folder / f"{table}.csv"
    change(pd.read_csv(path, dtype=str, keep_default_na=False)).to_csv(path, index=False)


def set_cell(row, column, text):
    def change(frame):
        frame.loc[row, column] = text
        return frame
    return change


def test_missing_or_bad_field_is_named(toy_profile, tmp_path):
    save_with(toy_profile, tmp_path, "ops", lambda ops: ops.drop(columns=["duration_s"]))
    with pytest.raises(ProfileError, match="ops.csv: missing field.*'duration_s'"):
        Profile.load(tmp_path)
    save_with(toy_profile, tmp_path, "memory", set_cell(3, "bytes", "lots"))
    with pytest.raises(ProfileError, match="memory.csv, row 4, column 'bytes': cannot read 'lots'"):
        Profile.load(tmp_path)


def test_truncated_and_inconsistent_folders(toy_profile, tmp_path):
    save_with(toy_profile, tmp_path, "tensors", lambda tensors: tensors.iloc[:-2])
    with pytest.raises(ProfileError, match="tensors.csv: .* rows, the header promises"):
        Profile.load(tmp_path)
    toy_profile.save(tmp_path)
    header = json.loads((tmp_path / "profile.json").read_text())
    del header["link"]
    (tmp_path / "profile.json").write_text(json.dumps(header))
    with pytest.raises(ProfileError, match="missing field 'link'"):
        Profile.load(tmp_path)
    save_with(toy_profile, tmp_path, "ops", set_cell(0, "inputs", "999"))
    with pytest.raises(ProfileError, match="ops.csv, row 1, column 'inputs': tensor 999 is not in"):
        Profile.load(tmp_path)


def test_not_a_folder(tmp_path):
    with pytest.raises(ProfileError, match="no such directory"):
        Profile.load(tmp_path / "nope")


def test_cleared_parameter_gradients_are_events_where_the_loop_holds_them():
    """A gradient held through forward is freed as forward ends (after the last forward op's
    own allocations) and made again by the first backward op of an op reading the parameter;
    one made in backward only appears there; both are held to the end."""
    from conftest import branchy_builder

    builder = branchy_builder()
    builder.parameter_gradient(1000, [0, 3], in_forward=True)    # stem conv and branch_a
    builder.parameter_gradient(500, [9], in_forward=False)       # the classifier
    profile = builder.build(update_s=1e-4)
    ops = profile.ops
    bwd = {int(f): int(k) for k, f in zip(ops.op, ops.fwd_op) if f >= 0}
    memory = profile.memory
    events = memory[(memory.tensor == -1) & (memory.category == "gradient")
                    & memory.bytes.isin([1000, 500])]
    last_fwd, last = len(profile.forward_ops) - 1, profile.n_ops - 1
    assert list(zip(events.op, events.kind, events.bytes)) == [
        (0, "malloc", 1000), (last_fwd, "free", 1000), (bwd[9], "malloc", 500),
        (bwd[3], "malloc", 1000), (last, "free", 1000), (last, "free", 500)]
    mallocs = memory[(memory.op == last_fwd) & (memory.kind == "malloc")]
    assert len(mallocs) and (mallocs.index < events.index[1]).all()
    assert profile.memory_curve()[-1] == profile.resident_bytes
    with pytest.raises(ValueError, match="not forward ops"):
        builder.parameter_gradient(8, [99], in_forward=False)


def test_dict_rows_read_whole_columns_exactly_as_cell_by_cell(toy_profile, monkeypatch):
    """The builders' dict rows take the whole-column path; the same rows as text (what a
    CSV gives) are read cell by cell: the frames agree in values and types, and a cell the
    whole-column path must not accept (an int beyond the byte limit or int64, a boolean in an
    integer column) is still named as a problem."""
    from pooch_ext import profile_format
    from pooch_ext.profile_check import MAX_BYTES
    from pooch_ext.profile_format import parse_frame

    taken_whole = []
    whole_columns = profile_format._whole_column

    def spied(column, cells):
        typed = whole_columns(column, cells)
        if typed is not None:
            taken_whole.append(column.name)
        return typed
    monkeypatch.setattr(profile_format, "_whole_column", spied)

    for table in ("ops", "tensors", "memory"):
        frame = getattr(toy_profile, table)
        rows = [{k: (list(v) if isinstance(v, list) else v) for k, v in row.items()}
                for row in frame.to_dict("records")]
        as_text = [{k: (" ".join(map(str, v)) if isinstance(v, list) and k != "configs" else
                        v if isinstance(v, (list, tuple)) else str(v)) for k, v in row.items()}
                   for row in rows]
        problems: list = []
        whole = parse_frame(table, rows, problems)
        by_cell = parse_frame(table, as_text, problems)
        assert problems == []
        pd.testing.assert_frame_equal(whole, by_cell)
    assert {"op", "inputs", "bytes", "duration_s", "kind", "can_keep"} <= set(taken_whole)
    rows = toy_profile.memory.to_dict("records")
    for bad in (MAX_BYTES + 1, 2**70, True):
        problems = []
        parse_frame("memory", [dict(rows[0], bytes=bad)] + rows[1:], problems)
        assert [(p.row, p.column) for p in problems] == [(0, "bytes")]
