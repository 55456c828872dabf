# SPDX-License-Identifier: Apache-2.0
"""export_onnx.py's own rules, without ONNX Runtime (tests/onnx/check_export.sh runs the graphs):
the opset 17 -> 20 carry and the fused projections."""
import os
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import export_onnx  # noqa: E402


def graph(nodes, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3, 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_reduce_axes_become_an_input_and_gridsample_modes_are_renamed():
    m = graph([helper.make_node("ReduceMean", ["x"], ["r"], axes=[2, 3], keepdims=0),
               helper.make_node("GridSample", ["x", "r"], ["y"], mode="bicubic")])
    export_onnx.upgrade_opset(m, 20)
    red, gs = m.graph.node
    assert [a.name for a in red.attribute] == ["keepdims"] and len(red.input) == 2
    axes = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}[red.input[1]]
    assert axes.dtype == np.int64 and axes.tolist() == [2, 3]
    assert [a.s for a in gs.attribute if a.name == "mode"] == [b"cubic"]
    assert m.opset_import[0].version == 20 and m.ir_version >= 9


def test_at_19_gridsample_keeps_its_mode():
    m = graph([helper.make_node("GridSample", ["x", "x"], ["y"], mode="bilinear")])
    export_onnx.upgrade_opset(m, 19)
    assert [a.s for a in m.graph.node[0].attribute if a.name == "mode"] == [b"bilinear"]


def test_an_operator_without_a_rule_is_refused_by_name():
    m = graph([helper.make_node("Resize", ["x", "", "", ""], ["y"]), helper.make_node("Pad", ["x"], ["z"])])
    with pytest.raises(ValueError, match="no rule to carry Pad, Resize from opset 17 to 20"):
        export_onnx.upgrade_opset(m, 20)


def test_only_opset_17_is_carried():
    m = graph([helper.make_node("Relu", ["x"], ["y"])])
    m.opset_import[0].version = 13
    with pytest.raises(ValueError, match="17 expected"):
        export_onnx.upgrade_opset(m, 20)


def test_a_fused_group_gives_each_member_its_own_product():
    torch.manual_seed(0)
    lins = [torch.nn.Linear(8, n, bias=b) for n, b in ((4, True), (6, False), (2, True))]
    x, x2 = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        want = [lin(x) for lin in lins] + [lins[2](x2)]
        g = export_onnx._FusedGroup(lins)
        for i, lin in enumerate(lins):
            lin.forward = g.member(i)
        got = [lin(x) for lin in lins] + [lins[2](x2)]  # the last on another input: made again
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-6)
