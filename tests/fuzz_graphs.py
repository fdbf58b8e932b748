"""Hypothesis strategy: random *valid* ONNX graphs (opset 17) with feeds.

``fuzz_cases()`` draws a :class:`FuzzCase`: a model that passes
``onnx.checker.check_model(full_check=True)`` and runs in onnxruntime, plus
the inputs to run it on. The graphs mix:

* float ops: MatMul, Gemm, Add, Sub, Mul, Div (by a constant), Relu,
  Sigmoid, Softmax, ReduceMean, LayerNormalization;
* data movement: Reshape, Transpose, Concat, Gather (float data, int64
  indices: a constant index list, or an embedding table read with int64 ids);
* integer paths: Shape (feeding Reshape or ConstantOfShape), Cast float ->
  int64 -> float, Greater/Equal -> Where, integer Add;
* existing Casts (float -> fp16 [-> Relu in fp16] -> float, int -> float);
* initializers shared by several nodes, fan-out, graph outputs that are also
  read by other nodes, value_info for some intermediates, unnamed nodes;
* If nodes whose branches read values (and initializers) of the outer
  scopes, nested up to two levels, sometimes a branch that only passes an
  outer value through;
* a symbolic batch dimension ``N`` on every input (fed 1 to 3).

Values stay moderate (inputs in [-2, 2], weights scaled by 1/sqrt(fan-in))
so that fp16 is never expected to overflow. Float values that feed a Cast to
int64 or a comparison hold small integers ("integral": exact in fp16), so a
correct conversion cannot flip a discrete decision.

The structure is drawn from Hypothesis (so it shrinks); weights and feeds
come from a numpy generator seeded by a drawn integer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.printer
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
BATCH = "N"
F32, F16, I64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL
NUMPY = {F32: np.float32, F16: np.float16, I64: np.int64, BOOL: np.bool_}
INTEGRAL_MAX = 256  # integral floats stay exact in fp16 (and bf16) up to this magnitude
IDS_VOCAB = 6  # ids input values lie in [0, IDS_VOCAB)
DIMS = (2, 3, 4, 6, 8)
# Features that fuzz_cases(exclude=...) can turn off.
FEATURES = {
    "initializer-inputs": "initializers also listed as graph inputs (IR 3 style; torch keep_initializers_as_inputs)",
    "layer-norm-stats": "LayerNormalization with its optional Mean / InvStdDev outputs",
}


@dataclass
class Value:
    """A tensor visible in the scope being built."""

    name: str
    elem: int
    shape: tuple  # BATCH first for activations; ints elsewhere
    integral: bool = False  # float holding small integers
    mag: int = 0  # integral floats / ints: largest magnitude
    lo: int = 0  # int64: value range (inclusive)
    hi: int = 0

    @property
    def batched(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] == BATCH


@dataclass
class FuzzCase:
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]

    def __repr__(self) -> str:
        shapes = {k: (v.dtype.name, v.shape) for k, v in self.feeds.items()}
        return f"FuzzCase(feeds={shapes}, model=\n{onnx.printer.to_text(self.model)}\n)"

    def _repr_pretty_(self, p, cycle) -> None:  # Hypothesis prints falsifying examples with this
        p.text(repr(self))


@dataclass
class _Scope:
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    values: list = field(default_factory=list)  # Values visible here (outer ones included)
    weights: list = field(default_factory=list)  # float initializers visible here
    depth: int = 0


class _Builder:
    def __init__(self, draw, seed: int, exclude: frozenset[str] = frozenset()):
        self.draw = draw
        self.rng = np.random.default_rng(seed)
        self.exclude = exclude
        self.initializer_inputs = "initializer-inputs" not in exclude and self.flag(3)
        self.counter = 0
        self.names: set[str] = set()
        self.scope = _Scope()
        self.inputs: list[onnx.ValueInfoProto] = []
        self.input_values: dict[str, Value] = {}
        self.value_info: list[onnx.ValueInfoProto] = []
        self.node_outputs: list[Value] = []  # main-graph node outputs (output candidates)

    # ------------------------------------------------------------- basics

    def fresh(self, base: str) -> str:
        self.counter += 1
        name = f"{base}{self.counter}"
        self.names.add(name)
        return name

    def tensor_name(self) -> str:
        """A new tensor name; now and then one the converter would like to
        derive from another tensor (``t3_fp16``, ``t3_bf16_cast``)."""
        if self.names and self.flag(1):
            base = self.choice(sorted(self.names))
            name = base + self.choice(["_fp16", "_bf16", "_fp32", "_fp16_cast", "_fp16_1"])
            if name not in self.names:
                self.names.add(name)
                return name
        return self.fresh("t")

    def choice(self, options):
        return self.draw(st.sampled_from(options))

    def flag(self, p_true_in_10: int) -> bool:
        return self.draw(st.integers(0, 9)) < p_true_in_10

    def add_node(self, op: str, inputs: list[str], outputs: list[Value], **attrs) -> None:
        name = self.fresh(f"{op.lower()}_") if self.flag(8) else ""
        self.scope.nodes.append(helper.make_node(op, inputs, [v.name for v in outputs], name=name, **attrs))
        for v in outputs:
            if not v.name:  # an optional output left out
                continue
            self.scope.values.append(v)
            if self.scope.depth == 0:
                self.node_outputs.append(v)
            if self.scope.depth == 0 and self.flag(2):
                self.value_info.append(value_info(v))

    def new(self, elem: int, shape: tuple, **kw) -> Value:
        return Value(self.tensor_name(), elem, tuple(shape), **kw)

    def pick(self, predicate) -> Value | None:
        candidates = [v for v in self.scope.values if predicate(v)]
        if not candidates:
            return None
        return self.choice(candidates)

    def acts(self, v: Value) -> bool:
        return v.elem == F32 and v.batched and len(v.shape) >= 2

    def weight(self, shape: tuple, *, scale: float | None = None, around: float = 0.0, shared: bool = True) -> str:
        """A float initializer of ``shape``, reused from the visible ones half the time."""
        if shared:
            same = [w for w in self.scope.weights if w.shape == tuple(shape)]
            if same and self.flag(5):
                return self.choice(same).name
        fan_in = shape[0] if shape else 1
        scale = 1.0 / math.sqrt(max(fan_in, 1)) if scale is None else scale
        array = (around + self.rng.uniform(-scale, scale, size=shape)).astype(np.float32)
        name = self.fresh("w")
        self.scope.inits.append(numpy_helper.from_array(array, name))
        self.scope.weights.append(Value(name, F32, tuple(shape)))
        if self.initializer_inputs and self.scope.depth == 0 and self.flag(5):
            # an overridable initializer (IR 3 style, torch keep_initializers_as_inputs=True)
            self.inputs.append(value_info(Value(name, F32, tuple(shape))))
        return name

    def int_const(self, values, shape=None) -> str:
        array = np.asarray(values, dtype=np.int64)
        if shape is not None:
            array = array.reshape(shape)
        name = self.fresh("c")
        if self.flag(5):
            self.scope.inits.append(numpy_helper.from_array(array, name))
        else:
            self.scope.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        return name

    def float_scalar(self, value: float) -> str:
        name = self.fresh("s")
        if self.flag(5):
            self.scope.nodes.append(helper.make_node("Constant", [], [name], value_float=float(value)))
        else:
            tensor = numpy_helper.from_array(np.array(value, dtype=np.float32), name)
            self.scope.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        return name

    def add_input(self, name: str, elem: int, shape: tuple, **kw) -> Value:
        v = Value(name, elem, tuple(shape), **kw)
        self.inputs.append(value_info(v))
        self.input_values[name] = v
        self.scope.values.append(v)
        return v

    # ---------------------------------------------------------------- ops

    def op_unary(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        op = self.choice(["Relu", "Sigmoid"])
        out = self.new(F32, x.shape, integral=x.integral and op == "Relu", mag=x.mag)
        self.add_node(op, [x.name], [out])

    def op_binary(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        op = self.choice(["Add", "Mul", "Sub", "Div"])
        how = self.draw(st.integers(0, 3))
        integral, mag = False, 0
        if op == "Div":
            divisor = self.choice([2.0, -4.0, 0.5])
            y = self.weight(x.shape[-1:], scale=0.5, around=divisor, shared=True) if how < 2 else self.float_scalar(divisor)
        elif how == 0:
            other = self.pick(lambda v: self.acts(v) and v.shape == x.shape)
            y = other.name
            if x.integral and other.integral:
                mag = x.mag * other.mag if op == "Mul" else x.mag + other.mag
                integral = mag <= INTEGRAL_MAX
        elif how == 1:
            y = self.weight(x.shape[-1:], shared=True)
        elif how == 2:
            c = self.choice([0.5, 1.0, -2.0, 3.0])
            y = self.float_scalar(c)
            if x.integral and c in (1.0, -2.0, 3.0):
                mag = x.mag * 3 if op == "Mul" else x.mag + 3
                integral = mag <= INTEGRAL_MAX
        else:
            other = self.pick(lambda v: self.acts(v) and broadcasts(v.shape, x.shape))
            y = other.name
        self.add_node(op, [x.name, y], [self.new(F32, x.shape, integral=integral, mag=mag)])

    def op_matmul(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        e = self.choice(DIMS)
        w = self.weight((x.shape[-1], e))
        self.add_node("MatMul", [x.name, w], [self.new(F32, (*x.shape[:-1], e))])

    def op_gemm(self) -> None:
        x = self.pick(lambda v: self.acts(v) and len(v.shape) == 2)
        if x is None:
            return
        d, e = x.shape[1], self.choice(DIMS)
        trans_b = self.flag(5)
        inputs = [x.name, self.weight((e, d) if trans_b else (d, e))]
        if self.flag(6):
            inputs.append(self.weight((e,), scale=0.5))
        attrs = {"transB": 1} if trans_b else {}
        if self.flag(3):
            attrs["alpha"] = 0.5
        self.add_node("Gemm", inputs, [self.new(F32, (BATCH, e))], **attrs)

    def op_clip(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        low = self.weight((), scale=0.2, around=-1.0) if self.flag(5) else ""
        high = self.float_scalar(self.choice([0.5, 1.5])) if self.flag(7) or not low else ""
        inputs = [x.name, low, high] if high else [x.name, low]
        self.add_node("Clip", inputs, [self.new(F32, x.shape)])

    def op_softmax(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        self.add_node("Softmax", [x.name], [self.new(F32, x.shape)], axis=self.choice([-1, 1]))

    def op_reduce_mean(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        keep = len(x.shape) == 2 or self.flag(5)
        shape = (*x.shape[:-1], 1) if keep else x.shape[:-1]
        self.add_node("ReduceMean", [x.name], [self.new(F32, shape)], axes=[-1], keepdims=int(keep))

    def op_layer_norm(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        d = x.shape[-1]
        inputs = [x.name, self.weight((d,), scale=0.2, around=1.0)]
        if self.flag(6):
            inputs.append(self.weight((d,), scale=0.2))
        outputs = [self.new(F32, x.shape)]
        # Mean / InvStdDev outputs: float32 whatever X is (stash_type)
        extra = 0 if "layer-norm-stats" in self.exclude else self.draw(st.integers(0, 3))
        if extra:
            stats = (*x.shape[:-1], 1)
            mean, inv = self.new(F32, stats), self.new(F32, stats)
            outputs += [mean, inv] if extra == 3 else [mean] if extra == 1 else [Value("", F32, stats), inv]
        self.add_node("LayerNormalization", inputs, outputs, axis=-1, epsilon=1e-5)

    def op_reshape(self) -> None:
        x = self.pick(lambda v: self.acts(v) and len(v.shape) in (2, 3) and (len(v.shape) == 3 or factors(v.shape[1])))
        if x is None:
            return
        if len(x.shape) == 2:
            a = self.choice(factors(x.shape[1]))
            target, shape = [0, a, x.shape[1] // a], (BATCH, a, x.shape[1] // a)
        else:
            target, shape = [0, -1], (BATCH, x.shape[1] * x.shape[2])
        self.add_node("Reshape", [x.name, self.int_const(target)], [self.new(F32, shape, integral=x.integral, mag=x.mag)])

    def op_transpose(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        if len(x.shape) == 3:
            perm, shape = [0, 2, 1], (BATCH, x.shape[2], x.shape[1])
        else:
            perm, shape = [0, 1], x.shape
        self.add_node("Transpose", [x.name], [self.new(F32, shape, integral=x.integral, mag=x.mag)], perm=perm)

    def op_concat(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        parts = [x]
        for _ in range(self.draw(st.integers(1, 2))):
            parts.append(self.pick(lambda v: self.acts(v) and v.shape[:-1] == x.shape[:-1]))
        shape = (*x.shape[:-1], sum(p.shape[-1] for p in parts))
        integral = all(p.integral for p in parts)
        out = self.new(F32, shape, integral=integral, mag=max(p.mag for p in parts))
        self.add_node("Concat", [p.name for p in parts], [out], axis=-1)

    def op_gather(self) -> None:
        if self.flag(5):
            x = self.pick(self.acts)
            if x is None:
                return
            d = x.shape[-1]
            k = self.draw(st.integers(1, 3))
            idx = [int(i) for i in self.rng.integers(-d, d, size=k)]
            out = self.new(F32, (*x.shape[:-1], k), integral=x.integral, mag=x.mag)
            self.add_node("Gather", [x.name, self.int_const(idx)], [out], axis=len(x.shape) - 1)
            return
        ids = self.pick(lambda v: v.elem == I64 and v.batched and v.lo >= 0 and v.hi < 16)
        if ids is None:
            return
        vocab, e = ids.hi + 1 + self.draw(st.integers(0, 2)), self.choice(DIMS)
        table = self.weight((vocab, e), scale=1.0)
        self.add_node("Gather", [table, ids.name], [self.new(F32, (*ids.shape, e))], axis=0)

    def op_shape(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        shape_value = self.new(I64, (len(x.shape),), lo=0, hi=64)
        self.add_node("Shape", [x.name], [shape_value])
        if self.flag(5):
            y = self.pick(lambda v: self.acts(v) and v.shape == x.shape)
            self.add_node("Reshape", [y.name, shape_value.name], [self.new(F32, x.shape, integral=y.integral, mag=y.mag)])
        else:
            fill = numpy_helper.from_array(np.array([self.choice([0.5, 1.0, -1.5])], dtype=np.float32))
            self.add_node("ConstantOfShape", [shape_value.name], [self.new(F32, x.shape)], value=fill)

    def op_cast_int(self) -> None:
        x = self.pick(lambda v: self.acts(v) and v.integral)
        if x is None:
            return
        self.add_node("Cast", [x.name], [self.new(I64, x.shape, lo=-x.mag, hi=x.mag)], to=I64)

    def op_cast_float(self) -> None:
        i = self.pick(lambda v: v.elem == I64 and v.batched and len(v.shape) >= 2)
        if i is None:
            return
        mag = max(abs(i.lo), abs(i.hi))
        self.add_node("Cast", [i.name], [self.new(F32, i.shape, integral=mag <= INTEGRAL_MAX, mag=mag)], to=F32)

    def op_round_trip(self) -> None:
        x = self.pick(self.acts)
        if x is None:
            return
        half = self.new(F16, x.shape, integral=x.integral, mag=x.mag)
        self.add_node("Cast", [x.name], [half], to=F16)
        if self.flag(4):
            relu = self.new(F16, x.shape, integral=x.integral, mag=x.mag)
            self.add_node("Relu", [half.name], [relu])
            half = relu
        self.add_node("Cast", [half.name], [self.new(F32, x.shape, integral=x.integral, mag=x.mag)], to=F32)

    def op_where(self) -> None:
        i = self.pick(lambda v: v.elem == I64 and v.batched and len(v.shape) >= 2)
        if i is None:
            return
        x = self.pick(lambda v: self.acts(v) and v.shape == i.shape)
        if x is None:
            return
        cond = self.new(BOOL, i.shape)
        self.add_node(self.choice(["Greater", "Equal"]), [i.name, self.int_const(int(self.rng.integers(-1, 2)))], [cond])
        if self.flag(5):
            y = self.pick(lambda v: self.acts(v) and v.shape == x.shape).name
        else:
            y = self.float_scalar(self.choice([0.0, -1.0]))
        self.add_node("Where", [cond.name, x.name, y], [self.new(F32, x.shape)])

    def op_int_add(self) -> None:
        a = self.pick(lambda v: v.elem == I64 and v.batched)
        if a is None:
            return
        b = self.pick(lambda v: v.elem == I64 and v.shape == a.shape) if self.flag(5) else None
        if b is None:
            c = int(self.rng.integers(0, 3))
            self.add_node("Add", [a.name, self.int_const(c)], [self.new(I64, a.shape, lo=a.lo + c, hi=a.hi + c)])
        else:
            self.add_node("Add", [a.name, b.name], [self.new(I64, a.shape, lo=a.lo + b.lo, hi=a.hi + b.hi)])

    def op_if(self) -> None:
        if self.scope.depth >= 2:
            return
        x = self.pick(self.acts)
        if x is None:
            return
        cond = self.input_values.get("flag") or self.add_input("flag", BOOL, ())
        branches = [self.branch(x, name) for name in ("then", "else")]
        out = self.new(F32, x.shape)
        self.add_node("If", [cond.name], [out], then_branch=branches[0], else_branch=branches[1])

    # ------------------------------------------------------------ subgraph

    BRANCH_OPS = ("identity", "unary", "binary", "layer_norm", "softmax", "round_trip", "square", "where", "if")

    def branch(self, x: Value, label: str) -> onnx.GraphProto:
        """A branch computing a tensor of ``x``'s shape from outer values
        (``x`` itself, other outer activations, outer initializers). A branch
        has at least one node: the checker refuses a subgraph output that names
        an outer value (an Identity passes one through)."""
        outer = self.scope
        self.scope = _Scope(values=list(outer.values), weights=list(outer.weights), depth=outer.depth + 1)
        current = x
        for _ in range(self.draw(st.integers(1, 3))):
            current = self.branch_op(self.choice(self.BRANCH_OPS), current)
        if not self.scope.nodes or current is x:
            current = self.branch_op("identity", current)
        graph = helper.make_graph(self.scope.nodes, self.fresh(label), [], [value_info(current)], self.scope.inits)
        self.scope = outer
        return graph

    def branch_op(self, op: str, x: Value) -> Value:
        """One shape-preserving op on ``x`` inside a branch."""
        out = self.new(F32, x.shape)
        d = x.shape[-1]
        if op == "identity":
            self.add_node("Identity", [x.name], [out])
        elif op == "unary":
            self.add_node(self.choice(["Relu", "Sigmoid"]), [x.name], [out])
        elif op == "binary":
            other = self.pick(lambda v: self.acts(v) and v.shape == x.shape and v is not x)
            y = other.name if other is not None and self.flag(6) else self.weight((d,))
            self.add_node(self.choice(["Add", "Mul", "Sub"]), [x.name, y], [out])
        elif op == "layer_norm":
            self.add_node("LayerNormalization", [x.name, self.weight((d,), scale=0.2, around=1.0)], [out], axis=-1)
        elif op == "softmax":
            self.add_node("Softmax", [x.name], [out], axis=-1)
        elif op == "round_trip":
            half = self.new(F16, x.shape)
            self.add_node("Cast", [x.name], [half], to=F16)
            self.add_node("Cast", [half.name], [out], to=F32)
        elif op == "square":
            self.add_node("MatMul", [x.name, self.weight((d, d))], [out])
        elif op == "where":
            i = self.pick(lambda v: v.elem == I64 and v.shape == x.shape)
            if i is None:
                return x
            cond = self.new(BOOL, x.shape)
            self.add_node("Greater", [i.name, self.int_const(0)], [cond])
            self.add_node("Where", [cond.name, x.name, self.float_scalar(0.0)], [out])
        else:  # a nested If
            if self.scope.depth >= 2:
                return x
            cond = self.input_values.get("flag") or self.add_input("flag", BOOL, ())
            branches = [self.branch(x, name) for name in ("then", "else")]
            self.add_node("If", [cond.name], [out], then_branch=branches[0], else_branch=branches[1])
        return out

    MAIN_OPS = (
        "op_unary",
        "op_binary",
        "op_matmul",
        "op_gemm",
        "op_softmax",
        "op_clip",
        "op_reduce_mean",
        "op_layer_norm",
        "op_reshape",
        "op_transpose",
        "op_concat",
        "op_gather",
        "op_shape",
        "op_cast_int",
        "op_cast_float",
        "op_round_trip",
        "op_where",
        "op_int_add",
        "op_if",
    )


def value_info(v: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(v.name, v.elem, list(v.shape))


def broadcasts(small: tuple, big: tuple) -> bool:
    return len(small) == len(big) and all(s == b or s == 1 for s, b in zip(small, big, strict=True))


def factors(d: int) -> list[int]:
    return [a for a in range(2, d) if d % a == 0]


@st.composite
def fuzz_cases(draw, max_ops: int = 20, exclude: frozenset[str] = frozenset()) -> FuzzCase:
    """A random valid model (opset 17) and feeds for it. ``exclude`` turns
    features off (see FEATURES), e.g. ones that trigger a known bug."""
    seed = draw(st.integers(0, 2**32 - 1))
    b = _Builder(draw, seed, frozenset(exclude))
    d0 = draw(st.sampled_from((4, 6, 8)))
    b.add_input("x", F32, (BATCH, d0))
    if b.flag(5):
        b.add_input("xi", F32, (BATCH, d0), integral=True, mag=4)
    if b.flag(4):
        b.add_input("k", I64, (BATCH, d0), lo=-3, hi=3)
    if b.flag(4):
        ids_shape = (BATCH,) if b.flag(5) else (BATCH, 2)
        b.add_input("ids", I64, ids_shape, lo=0, hi=IDS_VOCAB - 1)
    for _ in range(draw(st.integers(1, max_ops))):
        getattr(b, draw(st.sampled_from(_Builder.MAIN_OPS)))()
    candidates = [*b.node_outputs[::-1], b.input_values["x"]]  # shrinks towards the last value
    outputs: list[Value] = []
    for _ in range(draw(st.integers(1, 3))):
        v = draw(st.sampled_from(candidates))
        if v not in outputs:
            outputs.append(v)
    if not b.node_outputs:  # an empty graph would pass x through: give it one node
        out = b.new(F32, (BATCH, d0))
        b.add_node("Relu", ["x"], [out])
        outputs = [out]
    graph = helper.make_graph(
        b.scope.nodes,
        "fuzz",
        b.inputs,
        [value_info(v) for v in outputs],
        b.scope.inits,
        value_info=[vi for vi in b.value_info if vi.name not in {v.name for v in outputs}],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="amp-convert-fuzz")
    model.ir_version = IR_VERSION
    batch = draw(st.integers(1, 3))
    flag = draw(st.booleans())
    return FuzzCase(model, make_feeds(b.input_values, batch, flag, seed))


def make_feeds(inputs: dict[str, Value], batch: int, flag: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed ^ 0x5EED)
    feeds = {}
    for name, v in inputs.items():
        shape = tuple(batch if d == BATCH else d for d in v.shape)
        if v.elem == BOOL:
            feeds[name] = np.array(flag)
        elif v.elem == I64:
            feeds[name] = rng.integers(v.lo, v.hi + 1, size=shape).astype(np.int64)
        elif v.integral:
            feeds[name] = rng.integers(-v.mag, v.mag + 1, size=shape).astype(np.float32)
        else:
            feeds[name] = rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)
    return feeds
