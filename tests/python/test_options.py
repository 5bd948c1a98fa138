"""packpipe.PipelineShape and packpipe.PartitionOptions: one spelling per parameter (the CLI's flags),
keyword constructors, read/write properties checked when set, repr and equality."""
import copy

import numpy as np
import pytest

import packpipe
from packpipe import PartitionOptions, PipelineShape


def test_shape_defaults_keywords_and_properties():
    s = PipelineShape()
    assert (s.stages, s.chunks, s.layers_per_stage, s.dp, s.tp, s.zero, s.memory_mb) == (1, 1, 0, 1, 1, 1, 0.0)
    s = PipelineShape(stages=4, chunks=2, layers_per_stage=3, dp=2, tp=2, zero=3, memory_mb=36000)
    assert (s.stages, s.chunks, s.layers_per_stage, s.dp, s.tp, s.zero, s.memory_mb) == (4, 2, 3, 2, 2, 3, 36000.0)
    s.stages = np.int64(8)  # numpy integers are integers
    s.memory_mb = 1000
    assert s.stages == 8 and s.memory_mb == 1000.0
    with pytest.raises(TypeError):
        PipelineShape(4)  # keywords only: no order to get wrong
    with pytest.raises(TypeError):
        PipelineShape(zero_stage=1)  # one spelling: zero


def test_shape_repr_round_trips_and_equality():
    s = PipelineShape(stages=4, chunks=2, dp=2, memory_mb=1.5)
    assert repr(s) == "PipelineShape(stages=4, chunks=2, layers_per_stage=0, dp=2, tp=1, zero=1, memory_mb=1.5)"
    assert eval(repr(s), {"PipelineShape": PipelineShape}) == s
    assert s == PipelineShape(stages=4, chunks=2, dp=2, memory_mb=1.5)
    assert s != PipelineShape(stages=4, chunks=2, dp=2)
    assert s != "PipelineShape" and s != PartitionOptions()
    c = copy.copy(s)
    c.stages = 2
    assert c != s and s.stages == 4 and copy.deepcopy(s) == s


@pytest.mark.parametrize("field, value, message", [
    ("stages", 0, r"stages must be in \[1, 65536\], found 0"),
    ("stages", 2**31 - 1, r"stages must be in \[1, 65536\], found 2147483647"),
    ("chunks", 2**40, r"chunks must be in \[1, 65536\]"),
    ("dp", 0, r"dp must be in \[1, 65536\]"),
    ("tp", 2**17, r"tp must be in \[1, 65536\]"),
    ("zero", 4, r"ZeRO stage \(zero / --zero\) must be 0-3, found 4"),
    ("memory_mb", 1e300, r"memory limit \(memory_mb / --memory-mb\) must be in"),
    ("memory_mb", float("nan"), r"memory limit \(memory_mb / --memory-mb\) must be in"),
    ("memory_mb", -1.0, r"memory limit \(memory_mb / --memory-mb\) must be in"),
    ("stages", -1, "stages must not be negative, found -1"),
    ("layers_per_stage", -2, "layers_per_stage must not be negative, found -2"),
    ("zero", -1, "zero must not be negative"),
    ("dp", 2**64, "dp must be at most"),
    ("tp", 1.5, "tp must be an integer, found 1.5 of type float"),
])
def test_shape_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        PipelineShape(**{field: value})
    s = PipelineShape(stages=2)
    with pytest.raises(ValueError, match=message):
        setattr(s, field, value)
    assert s == PipelineShape(stages=2)  # a refused value leaves the object as it was


def test_shape_stage_layers_keyword_property_and_value_semantics():
    s = PipelineShape(stages=2, chunks=2)
    assert s.stage_layers == []
    u = PipelineShape(stages=2, chunks=2, stage_layers=[9, 7, 7, 9])
    assert u.stage_layers == [9, 7, 7, 9] and u != s
    assert repr(u) == ("PipelineShape(stages=2, chunks=2, layers_per_stage=0, dp=1, tp=1, zero=1, memory_mb=0.0, "
                       "stage_layers=[9, 7, 7, 9])")
    assert eval(repr(u), {"PipelineShape": PipelineShape}) == u
    c = copy.copy(u)
    c.stage_layers = np.array([8, 8, 8, 8], dtype=np.int64)  # any integer sequence; stored as a list
    assert c.stage_layers == [8, 8, 8, 8] and u.stage_layers == [9, 7, 7, 9] and copy.deepcopy(u) == u
    c.stage_layers = ()
    assert c == s
    with pytest.raises(ValueError, match=r"stage_layers \(--layer-split\) lists 4 stages, the pipeline has 2 virtual "
                                         r"stages \(stages 2 x chunks 1\)"):
        u.chunks = 1  # the split no longer matches: clear it (or set a new one) first
    assert u.chunks == 2


@pytest.mark.parametrize("value, message", [
    ([8, 8, 8], r"stage_layers \(--layer-split\) lists 3 stages, the pipeline has 4 virtual stages"),
    ([8, 0, 8, 8], r"stage_layers\[1\] \(--layer-split\) must be in \[1, 1048576\], found 0"),
    ([8, 8, 8, 2**21], r"stage_layers\[3\] \(--layer-split\) must be in \[1, 1048576\], found 2097152"),
    ([8, -1, 8, 8], r"stage_layers\[1\] must not be negative, found -1"),
    ([8, 8, 1.5, 8], r"stage_layers\[2\] must be an integer, found 1.5 of type float"),
    ("8888", "stage_layers must be a sequence of integers .*found '8888' of type str"),
    (8, "stage_layers must be a sequence of integers .*found 8 of type int"),
])
def test_shape_bad_stage_layers_name_the_entry(value, message):
    with pytest.raises(ValueError, match=message):
        PipelineShape(stages=4, stage_layers=value)
    s = PipelineShape(stages=4, stage_layers=[5, 11, 10, 6])
    with pytest.raises(ValueError, match=message):
        s.stage_layers = value
    assert s == PipelineShape(stages=4, stage_layers=[5, 11, 10, 6])  # a refused value leaves the shape as it was


def test_options_defaults_keywords_and_properties():
    o = PartitionOptions()
    assert (o.method, o.mbs, o.tokens, o.round_multiple, o.recompute, o.oversize, o.cost_basis, o.order,
            o.pack_windows, o.threads) == ("dp", 0, 0, 8, "auto", "error", "auto", "auto", False, 0)
    o = PartitionOptions(method="fixed", mbs=4, tokens=2**40, round_multiple=64, recompute="full", oversize="drop",
                         cost_basis="dynapipe", order="path", pack_windows=True, threads=2)
    assert (o.method, o.mbs, o.tokens, o.round_multiple, o.recompute, o.oversize, o.cost_basis, o.order,
            o.pack_windows, o.threads) == ("fixed", 4, 2**40, 64, "full", "drop", "dynapipe", "path", True, 2)
    o.method = "packing"
    o.oversize = "truncate"
    assert o.method == "packing" and o.oversize == "truncate"
    with pytest.raises(TypeError):
        PartitionOptions("dp")


def test_options_repr_round_trips_and_equality():
    o = PartitionOptions(method="tokens", tokens=4096)
    assert repr(o) == ("PartitionOptions(method='tokens', mbs=0, tokens=4096, round_multiple=8, recompute='auto', "
                       "oversize='error', cost_basis='auto', order='auto', pack_windows=False, threads=0, "
                       "layouts=('padded', 'packed'), layout=None, capacity=0, slicing='auto', min_slice_tokens=64)")
    assert eval(repr(o), {"PartitionOptions": PartitionOptions}) == o
    assert o != PartitionOptions(method="tokens", tokens=4097)
    assert o != PartitionOptions()
    assert copy.deepcopy(o) == o


@pytest.mark.parametrize("field, value, message", [
    ("method", "greedy", r"unknown partition method 'greedy' \(expected dp, dynapipe, fixed, tokens, packing, wlb, slicing\)"),
    ("recompute", "some", r"unknown recompute policy 'some' \(expected auto, none, selective, full\)"),
    ("oversize", "squash", r"unknown oversize policy 'squash' \(expected error, truncate, drop, slice\)"),
    ("cost_basis", "flops", r"unknown cost basis 'flops' \(expected auto, stages, dynapipe\)"),
    ("order", "tsp", r"unknown encoder-decoder order 'tsp' \(expected auto, sorted, path\)"),
    ("mbs", -1, "mbs must not be negative, found -1"),
    ("tokens", -1, "tokens must not be negative"),
    ("tokens", 2**64, "tokens must be at most"),
    ("tokens", 1.5, "tokens must be an integer"),
    ("round_multiple", -8, "round_multiple must not be negative"),
    ("threads", -1, "threads must not be negative"),
    ("threads", 2**40, "threads must be at most 2147483647"),
])
def test_options_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        PartitionOptions(**{field: value})
    o = PartitionOptions()
    with pytest.raises(ValueError, match=message):
        setattr(o, field, value)
    assert o == PartitionOptions()


def test_layouts_packed_mask_and_a_layout_listed_twice():
    # packed-mask: the executor also runs dense rows under a block mask (packing-mask baselines become
    # candidates); packpipe's own micro-batches still need padded or packed.
    o = PartitionOptions(layouts=("padded", "packed-mask"))
    assert set(o.layouts) == {"padded", "packed-mask"}
    for twice in (("padded", "padded"), "packed,packed"):
        with pytest.raises(ValueError, match="is listed twice"):
            PartitionOptions(layouts=twice)
        o = PartitionOptions()
        with pytest.raises(ValueError, match="is listed twice"):
            o.layouts = twice
        assert o == PartitionOptions()
    cm = packpipe.CostModel("gpt-1.3b", "A100-40GB")
    with pytest.raises(ValueError, match="one or both of padded and packed"):
        packpipe.partition(cm, [100, 200, 300], options=PartitionOptions(layouts=("packed-mask",)))
    part = packpipe.partition(cm, [100, 200, 300] * 8, options=PartitionOptions(layouts=("packed", "packed-mask")))
    assert sum(len(mb.samples) for mb in part.microbatches) == 24
