"""The graph IR text form: printed text parses back to the same graph and prints the same.

These tests build graphs from Node/Value directly, so they do not depend on the op registry.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.text import SMALL_CONST, array_digest, parse_graph, placeholder_digest, print_graph
from tensorfuse.ir.types import DType, TensorType
from tensorfuse.ir.verify import graph_diff


def T(text: str) -> TensorType:
    return TensorType.parse(text)


def roundtrip(g: Graph, constants=None) -> Graph:
    """print -> parse -> print: same text, structurally equal graph."""
    text = print_graph(g)
    g2 = parse_graph(text, constants)
    assert print_graph(g2) == text
    assert graph_diff(g, g2) == []
    return g2


TEXTS = [
    # the smallest graph
    "graph main() {\n  return\n}\n",
    # quoted names, domains, omitted inputs, several outputs, tensor attrs, node names
    """\
graph main(%input: f32[1,3,8,8], %"onnx::Mask_0": i64[1,4]) {
  const %w: f32[8,3,3,3] = digest:3f2a9c1b0e4d5a67
  const %shape: i64[2] = [1, -1]
  const %eps: f32[] = 1e-05
  %12: f32[1,8,8,8] = Conv(%input, %w, _) {group=1, kernel_shape=[3,3], pads=[1,1,1,1]} @conv_1
  %a: f32[1,4,8,8], %b: f32[1,4,8,8] = Split(%12) {axis=1, num_outputs=2} @"/split/Split"
  %y: f32[1,4,8,8] = tensorfuse::FusedConv(%a, _, %w) {activation="Relu"} @fused_2
  %"onnx::Reshape_7": f32[4,64] = Reshape(%y, %shape)
  %s: f32[1,4,8,8] = com.microsoft::Gelu(%b) @"a \\"quoted\\" name"
  return %"onnx::Reshape_7", %s, %"onnx::Mask_0"
}
""",
    # every attribute kind
    """\
graph "my model"(%x: f32[2]) {
  %z: f32[1] = ConstantOfShape(%x) {value=tensor(f32[1]: [0.0])}
  %q: f32[2] = Op(%x, %z) {a=-1, b=0.5, c=inf, d=-inf, e=nan, f=1e-05, g="s", h=[1,2,3], i=[0.5,-2.0], \
j=["a","b c"], k=[], l=true, m=tensor(i64[]: 7), n=tensor(bool[2,2]: [[true, false], [false, true]]), \
o=tensor(f64[0]: [])}
  return %q
}
""",
    # small constants of every dtype, empty and scalar ones
    """\
graph consts() {
  const %a: f32[3] = [0.1, -0.0, 3.4028235e+38]
  const %b: f16[2] = [0.1, 6.55e+04]
  const %c: bf16[2] = [1.0, -2.5]
  const %d: f64[2,2] = [[0.1, 1e-300], [inf, nan]]
  const %e: u64[1] = [18446744073709551615]
  const %f: i8[2] = [-128, 127]
  const %g: bool[3] = [true, false, true]
  const %h: i64[0,3] = []
  const %i: i32[] = -7
  const %j: u8[2,0] = [[], []]
  return %a, %b, %c, %d, %e, %f, %g, %h, %i, %j
}
""",
]


@pytest.mark.parametrize("text", TEXTS)
def test_printed_text_round_trips(text):
    text = text.replace("\\\n", "")
    g = parse_graph(text)
    assert print_graph(g) == text
    assert graph_diff(g, parse_graph(print_graph(g))) == []


def test_parse_builds_wired_graph():
    g = parse_graph(TEXTS[1])
    assert [v.name for v in g.inputs] == ["input", "onnx::Mask_0"]
    conv, split, fused, reshape, gelu = g.nodes
    assert (conv.op, conv.domain, conv.name) == ("Conv", "", "conv_1")
    assert conv.inputs[0] is g.inputs[0] and conv.inputs[1] is g.constants["w"] and conv.inputs[2] is None
    assert conv.attrs == {"group": 1, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    assert [o.name for o in split.outputs] == ["a", "b"] and split.name == "/split/Split"
    assert all(o.producer is split for o in split.outputs)
    assert (fused.domain, fused.op, fused.inputs[1]) == ("tensorfuse", "FusedConv", None)
    assert gelu.domain == "com.microsoft" and gelu.name == 'a "quoted" name'
    assert g.constants["shape"].data.dtype == np.int64 and g.constants["shape"].data.tolist() == [1, -1]
    eps = g.constants["eps"].data
    assert eps.shape == () and eps.dtype == np.float32 and eps == np.float32(1e-05)
    assert g.outputs == [reshape.outputs[0], gelu.outputs[0], g.inputs[1]]
    assert g.value("12").type == T("f32[1,8,8,8]")


def test_parsed_names_are_reserved():
    g = parse_graph(TEXTS[1])
    assert g.fresh_name("a") != "a" and g.fresh_name("conv_1") != "conv_1"
    assert g.fresh_name("new") == "new"


def test_attribute_values_parse_to_python_values():
    g = parse_graph(TEXTS[2].replace("\\\n", ""))
    a = g.nodes[1].attrs
    assert a["a"] == -1 and type(a["a"]) is int
    assert a["b"] == 0.5 and type(a["b"]) is float
    assert a["c"] == math.inf and a["d"] == -math.inf and math.isnan(a["e"])
    assert a["g"] == "s" and a["h"] == [1, 2, 3] and a["i"] == [0.5, -2.0] and a["j"] == ["a", "b c"]
    assert a["k"] == [] and a["l"] is True
    assert a["m"].dtype == np.int64 and a["m"].shape == () and a["m"] == 7
    assert a["n"].dtype == np.bool_ and a["n"].tolist() == [[True, False], [False, True]]
    assert a["o"].dtype == np.float64 and a["o"].shape == (0,)
    v = g.nodes[0].attrs["value"]
    assert v.dtype == np.float32 and v.tolist() == [0.0]


def _graph_by_hand() -> Graph:
    """Every feature, built with Node/Value directly (no registry, no inference)."""
    g = Graph("main")
    x = Value("x", T("f32[1,5]"))
    odd = Value('we"ird \\ name\n∑', T("i64[2]"))
    g.inputs = [x, odd]
    rng = np.random.default_rng(0)
    consts = {
        "w": rng.standard_normal((5, 4)).astype(np.float32),                 # large: digest
        "b": rng.standard_normal(4).astype(np.float32),                      # small: values
        "h": rng.standard_normal((2, 3)).astype(np.float16),
        "d": rng.standard_normal(3),
        "k": np.array([-(2 ** 63), 2 ** 63 - 1], np.int64),
        "flags": np.array([[True], [False]]),
        "s": np.array(np.float32(np.pi)),
        "bf": np.array([0.1, 3.0], ml_dtypes.bfloat16),
    }
    for name, a in consts.items():
        g.constants[name] = Value(name, TensorType.of(a), data=a)
    c = g.constants
    mm = Value("onnx::MatMul_3", T("f32[1,4]"))
    s0, s1 = Value("s0", T("f32[1,1]")), Value("s1", T("f32[1,3]"))
    y = Value("y", T("f32[1,3]"))
    g.nodes = [
        Node("MatMul", [x, c["w"]], [mm], name="/l0/MatMul"),
        Node("Split", [mm, c["k"]], [s0, s1], {"axis": -1, "ratios": [0.25, 0.75]}, name="split"),
        Node("Fused", [s1, None, c["b"], None], [y], {"tag": "a\tb", "t": np.arange(3, dtype=np.int32),
                                                      "fs": [1e-7, float("nan")], "z": -0.0},
             name="", domain="tensorfuse"),
    ]
    g.outputs = [y, s0, odd, c["s"]]
    return g


def test_programmatic_graph_round_trips_with_constants():
    g = _graph_by_hand()
    consts = {k: v.data for k, v in g.constants.items()}
    g2 = roundtrip(g, consts)
    assert g2.constants["w"].data is consts["w"]
    for k, v in g.constants.items():
        assert v.data.dtype == g2.constants[k].data.dtype
        assert v.data.tobytes() == g2.constants[k].data.tobytes()   # bit-exact, f32/f16/bf16/f64
    n = g2.nodes[2]
    assert n.inputs[1] is None and n.inputs[3] is None and len(n.inputs) == 4
    assert n.attrs["t"].dtype == np.int32 and n.attrs["t"].tolist() == [0, 1, 2]
    assert math.copysign(1, n.attrs["z"]) == -1 and math.isnan(n.attrs["fs"][1])
    assert g2.inputs[1].name == 'we"ird \\ name\n∑'


def test_quoted_names_stay_on_one_line():
    text = print_graph(_graph_by_hand())
    assert len(text.splitlines()) == 1 + len(_graph_by_hand().constants) + 3 + 2
    assert '%"we\\"ird \\\\ name\\n∑": i64[2]' in text
    assert '%"onnx::MatMul_3": f32[1,4] = MatMul(%x, %w) @"/l0/MatMul"' in text
    assert "tensorfuse::Fused(%s1, _, %b, _) {" in text


def test_float_constants_are_bit_exact():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2 ** 32, size=4000, dtype=np.uint64).astype(np.uint32)
    vals = bits.view(np.float32)
    vals = vals[~np.isnan(vals)]
    for i in range(0, len(vals), SMALL_CONST):
        chunk = vals[i:i + SMALL_CONST]
        g = Graph("f")
        g.constants["c"] = Value("c", TensorType.of(chunk), data=chunk)
        g.outputs = [g.constants["c"]]
        assert roundtrip(g).constants["c"].data.tobytes() == chunk.tobytes()


def test_f32_constants_print_shortest():
    g = Graph("f")
    a = np.array([0.1, 1e-5, 1.0, 3.0e38, -2.5], np.float32)
    g.constants["c"] = Value("c", TensorType.of(a), data=a)
    assert "const %c: f32[5] = [0.1, 1e-05, 1.0, 3e+38, -2.5]" in print_graph(g)


def test_large_constant_prints_digest_and_reads_back_as_zeros():
    g = Graph("big")
    w = np.arange(SMALL_CONST + 1, dtype=np.float32)
    g.constants["w"] = Value("w", TensorType.of(w), data=w)
    g.outputs = [g.constants["w"]]
    text = print_graph(g)
    assert f"const %w: f32[{SMALL_CONST + 1}] = digest:{array_digest(w)}" in text
    g2 = parse_graph(text)
    data = g2.constants["w"].data
    assert data.dtype == np.float32 and data.shape == w.shape and not data.any()
    assert not data.flags.writeable and g2.constants["w"].known is None
    assert placeholder_digest(data) == array_digest(w) and placeholder_digest(w) is None
    assert print_graph(g2) == text                      # the stand-in keeps its digest
    assert print_graph(g2.copy()) == text
    assert parse_graph(text, {"w": w}).constants["w"].data is w
    assert parse_graph(text, {"other": w}).constants["w"].data is not w


def test_small_constants_print_values():
    g = Graph("small")
    a = np.arange(SMALL_CONST, dtype=np.int64).reshape(4, 4)
    g.constants["a"] = Value("a", TensorType.of(a), data=a)
    assert "const %a: i64[4,4] = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]" \
        in print_graph(g)


@pytest.mark.parametrize("bad", [
    np.arange(17, dtype=np.float64),                    # wrong dtype
    np.arange(16, dtype=np.float32),                    # wrong shape
    np.arange(17, dtype=np.float32)[::-1].copy(),       # other data: digest differs
])
def test_mismatched_constant_data_is_an_error(bad):
    digest = array_digest(np.arange(17, dtype=np.float32))
    text = f"graph g() {{\n  const %w: f32[17] = digest:{digest}\n  return %w\n}}\n"
    parse_graph(text, {"w": np.arange(17, dtype=np.float32)})
    with pytest.raises(ValueError, match="line 2"):
        parse_graph(text, {"w": bad})


def test_comments_and_blank_lines_are_ignored():
    text = """
# a dump
graph main(%x: f32[2]) {   # header

  %y: f32[2] = Relu(%x) {note="# not a comment"} @r   # trailing
  return %y
}
"""
    g = parse_graph(text)
    assert g.nodes[0].attrs == {"note": "# not a comment"}
    assert print_graph(g) == ('graph main(%x: f32[2]) {\n  %y: f32[2] = Relu(%x) {note="# not a comment"} @r\n'
                              "  return %y\n}\n")


def test_graph_str_is_the_text():
    g = _graph_by_hand()
    assert str(g) == print_graph(g)


HEAD = "graph main(%x: f32[2]) {\n"


@pytest.mark.parametrize("body, line, message", [
    ("  %y: f32[2] = Relu(%z)\n  return %y\n}\n", 2, "undefined value %z"),
    ("  %y: f32[2] = Relu(%x)\n  return %q\n}\n", 3, "undefined value %q"),
    ("  %y: f32[2] = Relu(%y)\n  return %y\n}\n", 2, "undefined value %y"),
    ("  %x: f32[2] = Relu(%x)\n  return %x\n}\n", 2, "defined twice"),
    ("  %y: f32[2] = Relu(%x\n  return %y\n}\n", 2, "expected ','"),
    ("  %y: f32[2] = Relu(%x) {a=1, a=2}\n  return %y\n}\n", 2, "given twice"),
    ("  %y: f33[2] = Relu(%x)\n  return %y\n}\n", 2, "unknown dtype"),
    ("  %y: f32[2 = Relu(%x)\n  return %y\n}\n", 2, "expected ','"),
    ("  %y: f32[2] = Relu(%x) {a=\"open}\n  return %y\n}\n", 2, "expected a string"),
    ("  %y: f32[2] = Relu(%x) @n extra\n  return %y\n}\n", 2, "unexpected"),
    ("  const %c: f32[3] = [1.0, 2.0]\n  return %c\n}\n", 2, "shape \\[2\\]"),
    ("  const %c: i64[2] = [1, 2.5]\n  return %c\n}\n", 2, "expected an integer"),
    ("  const %c: bool[1] = [1]\n  return %c\n}\n", 2, "true or false"),
    ("  const %c: u8[1] = [-1]\n  return %c\n}\n", 2, "bad values"),
    ("  const %c: f32[2] = [[1.0], 2.0]\n  return %c\n}\n", 2, "bad values"),
    ("  const %c: f32[20] = digest:xyz\n  return %c\n}\n", 2, "hex digits"),
    ("  %y: f32[2] = Relu(%x)\n}\n", 3, "missing 'return'"),
    ("  return %x\n  %y: f32[2] = Relu(%x)\n}\n", 3, "expected '}'"),
    ("  return %x\n", 2, "missing closing"),
    ("  return %x\n}\n}\n", 4, "after the closing"),
])
def test_syntax_errors_name_the_line(body, line, message):
    with pytest.raises(ValueError, match=f"line {line}, column \\d+: .*{message}"):
        parse_graph(HEAD + body)


def test_header_errors():
    with pytest.raises(ValueError, match="line 1, .*expected 'graph"):
        parse_graph("grph main() {\n  return\n}\n")
    with pytest.raises(ValueError, match="line 2, .*expected '\\{'"):
        parse_graph("\ngraph main(%x: f32[2])\n  return\n}\n")
    with pytest.raises(ValueError, match="line 1, .*defined twice"):
        parse_graph("graph main(%x: f32[2], %x: f32[2]) {\n  return\n}\n")
    with pytest.raises(ValueError, match="empty text"):
        parse_graph("  # nothing\n")


def test_unprintable_attribute_is_a_type_error():
    g = Graph("g")
    x = Value("x", T("f32[2]"))
    g.inputs = [x]
    g.nodes = [Node("Relu", [x], [Value("y", T("f32[2]"))], {"bad": object()})]
    with pytest.raises(TypeError, match="no text form"):
        print_graph(g)


def test_types_come_from_the_text_not_inference():
    # Relu cannot turn f32[2] into i64[5]; the parser keeps what the text says (the verifier objects)
    g = parse_graph(HEAD + "  %y: i64[5] = Relu(%x)\n  return %y\n}\n")
    assert g.nodes[0].outputs[0].type == TensorType(DType.i64, (5,))
