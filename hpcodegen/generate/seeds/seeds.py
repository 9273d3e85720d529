"""Megatron's layout found from a model's structure (lazy torch: works on a meta model).

Most families transformers ships no ``base_model_tp_plan`` for spell the same layout:
an attention's q/k/v colwise and its output projection rowwise, an MLP's input
projections colwise and its output projection rowwise, the output head gathered. This
module finds those blocks in the built module tree, so such a family needs no rule file:

* **an MLP** is a module holding nothing but Linears, found by their shapes, not their
  names: one or more *input* Linears of one width ``h -> i`` and one *output* Linear
  ``i -> h`` (``i != h``), and no parameter of its own. Whatever the forward does between
  them runs on each rank's slice of ``i``; the transformers MLPs that this shape admits
  apply an activation and a product there (Llama's ``act(gate) * up``, GPT-J's ``act(fc_in)``).
* **an attention** is a module holding three input projections and one output projection
  (transformers' names, :data:`ATTN_INPUTS` and :data:`ATTN_OUTPUTS`: nothing in the
  shapes tells q from o), whose head counts the module names (``num_heads``, a config's
  ``num_attention_heads``, ``head_dim``); it may also hold per-head norms (over
  ``head_dim``: each rank normalises its own heads) and one-per-head parameters of its own
  (attention sinks). Not when its forward sizes heads from the config (the plan would not
  divide them), cuts a fused output into blocks, or takes a second stream of keys and
  values (:data:`CROSS_INPUTS`: a cross-attention's key/value gradient would stay partial).
* **the output head** (``get_output_embeddings``) and the embedding and norms are the
  lifter's defaults (:mod:`hpcodegen.generate.layouts.lift`), with or without seeds.

A fused projection whose row order the shapes cannot tell is read from the traced forward
first (:mod:`hpcodegen.generate.seeds.fused_seeds`). What only the forward shows (a residual added
inside the module, Linear pairs outside any block, Linears never called) is
:mod:`hpcodegen.generate.seeds.pair_seeds`'. Anything else (a recurrent mixer, a numeric detail of
one family) keeps its rule file
(``hpcodegen/generate/rules/``): docs/generate.md lists why each one remains.

The names this module reads are all here; :mod:`hpcodegen.generate.layouts.layouts` applies the same
block rule to modules an HF plan leaves unnamed (by name only, as it always has).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind

if TYPE_CHECKING:
    from hpcodegen.tracer.dataflow import Flow

#: an attention's input projections and its output projection, in transformers' names
ATTN_INPUTS = ("q_proj", "k_proj", "v_proj")
ATTN_OUTPUTS = ("o_proj", "out_proj", "dense")
#: an MLP's (column-parallel inputs, row-parallel output) in transformers' names: the
#: blocks an HF plan leaves unnamed are matched by these (seeds match MLPs by shape)
MLP_SHAPES = ((("gate_proj", "up_proj"), "down_proj"), (("up_proj",), "down_proj"),
              (("fc1",), "fc2"), (("w1", "w3"), "w2"))
#: forward inputs of a cross-attention: keys and values from a second stream
CROSS_INPUTS = ("key_value_states", "encoder_hidden_states", "cross_attention_states")
#: the rule name seeded assignments carry
SEED_RULE = "<structure>"


def is_linear(module: Any) -> bool:
    """``torch.nn.Linear`` or a subclass, or transformers' ``Conv1D`` (GPT-2's transposed
    Linear: the lifter shards it on its output columns), by class, without importing torch."""
    return any((c.__name__ == "Linear" and c.__module__.startswith("torch.nn"))
               or (c.__name__ == "Conv1D" and c.__module__.startswith("transformers."))
               for c in type(module).__mro__)


def io_features(module: Any) -> tuple[int, int]:
    """``(input width, output width)`` of a Linear or a ``Conv1D`` (weight ``(in, out)``)."""
    if hasattr(module, "in_features"):
        return module.in_features, module.out_features
    return module.weight.shape[0], module.nf


def children(modules: Mapping[str, Any], fqn: str) -> dict[str, Any]:
    """The direct children of ``fqn`` among ``modules`` (``named_modules``), by name."""
    prefix = f"{fqn}." if fqn else ""
    return {name[len(prefix):]: m for name, m in modules.items()
            if name.startswith(prefix) and "." not in name[len(prefix):]}


def config_value(obj: Any, name: str) -> Any:
    """``getattr`` that reads an attribute a config refuses to give (a per-layer head count
    read globally raises its own error) as absent."""
    try:
        return getattr(obj, name, None)
    except Exception:  # transformers' configs raise their own errors for ambiguous fields
        return None


def head_counts(module: Any) -> tuple[int, int, int] | None:
    """``(query heads, key/value heads, head dim)`` an attention module reads."""
    config = config_value(module, "config")
    nh = config_value(module, "num_heads") or config_value(config, "num_attention_heads")
    nkv = (config_value(module, "num_key_value_heads")
           or config_value(config, "num_key_value_heads") or nh)
    hd = config_value(module, "head_dim")
    if all(isinstance(v, int) and v > 0 for v in (nh, nkv, hd)):
        return nh, nkv, hd
    return None


def _held(kids: Mapping[str, Any]) -> set[str]:
    return {n for n, m in kids.items() if any(True for _ in m.parameters())}


def self_calls_on_params(source: str) -> list[tuple[str, str, int]]:
    """``(child, parameter, position)`` for each ``self.<child>(<parameter>, ...)`` call in a
    forward's source (or a method it calls) whose first argument is one of the enclosing
    function's own parameters, ``position`` counted after ``self``; in :func:`ast.walk`
    order per function; [] when the source does not parse. The one walk both the input
    readers (:func:`input_readers`) and an attention's read inputs
    (:func:`~hpcodegen.generate.seeds.attention_seeds.forward_inputs_read`) are taken from."""
    return list(_self_calls(source))


@functools.lru_cache(maxsize=256)
def _self_calls(source: str) -> tuple[tuple[str, str, int], ...]:
    """:func:`self_calls_on_params`, parsed once per source text: the blocks of a stack
    share one class, and the seeds ask for each block's readers several times."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return ()
    found: list[tuple[str, str, int]] = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        params = [a.arg for a in fn.args.args[1:]]
        for node in ast.walk(fn):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) \
                    and isinstance(func.value, ast.Name) and func.value.id == "self" \
                    and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in params:
                found.append((func.attr, node.args[0].id, params.index(node.args[0].id)))
    return tuple(found)


def input_readers(source: str) -> set[str]:
    """The ``self.<name>`` children a forward (or a method it calls) applies to its own first
    input: ``self.q_proj(hidden_states)`` in ``forward(self, hidden_states)``, or
    ``self.in_proj(input_states)`` in ``torch_forward(self, input_states)``."""
    return {child for child, _param, position in self_calls_on_params(source) if position == 0}


def _takes_second_stream(module: Any) -> bool:
    import inspect

    names = inspect.signature(type(module).forward).parameters
    return any(n in names for n in CROSS_INPUTS)


def attention_styles(module: Any, kids: Mapping[str, Any], by_shape: bool = True
                     ) -> dict[str, Kind] | None:
    """Megatron's styles for an attention (module docstring), or None. Its output
    projection is one of :data:`ATTN_OUTPUTS`, else (``by_shape``) the one other Linear
    that is not applied to the forward's input and maps back to the width q/k/v read
    (ModernBERT's ``Wo``)."""
    from hpcodegen.generate.seeds.module_facts import forward_source
    from hpcodegen.tracer.norms import is_norm

    out = [n for n in ATTN_OUTPUTS if is_linear(kids.get(n))]
    if not out and by_shape and is_linear(kids.get(ATTN_INPUTS[0])):
        readers = input_readers(forward_source(module))
        width = io_features(kids[ATTN_INPUTS[0]])[0]
        out = [n for n, m in kids.items() if n not in ATTN_INPUTS and n not in readers
               and is_linear(m) and io_features(m)[1] == width]
    heads = head_counts(module)
    if not (all(is_linear(kids.get(n)) for n in ATTN_INPUTS) and len(out) == 1 and heads):
        return None
    held = _held(kids)
    own = dict(module.named_parameters(recurse=False))
    norms = {n for n in held - {*ATTN_INPUTS, out[0]} if is_norm(kids[n])
             and kids[n].weight.numel() == heads[2]}
    # per-head parameters of its own (attention sinks, [heads]) split with the heads
    if held != {*ATTN_INPUTS, out[0], *norms} or not all(
            p.dim() == 1 and p.shape[0] == heads[0] for p in own.values()):
        return None
    return {**{n: Kind.COLWISE for n in (*ATTN_INPUTS, *own)}, out[0]: Kind.ROWWISE}


def named_mlp_styles(kids: Mapping[str, Any]) -> dict[str, Kind] | None:
    """Megatron's styles for an MLP of transformers' names (:data:`MLP_SHAPES`), or None."""
    held = _held(kids)
    for cols, row in MLP_SHAPES:
        if held == {*cols, row} and all(is_linear(kids[n]) for n in held):
            return {**{n: Kind.COLWISE for n in cols}, row: Kind.ROWWISE}
    return None


def mlp_styles(kids: Mapping[str, Any], order: Sequence[str]) -> dict[str, Kind] | None:
    """Megatron's styles for an MLP found by its shapes (module docstring), or None.

    One or two input projections ``h -> i`` and one output projection ``i -> h``; with one
    input projection the two shapes mirror each other, so the one the forward calls first
    (``order``: the block's children as the traced forward entered them,
    :meth:`~hpcodegen.tracer.dataflow.Flow.child_order`) reads the input (a third
    projection of the input would be an attention's)."""
    held = _held(kids)
    if len(held) not in (2, 3) or not all(is_linear(kids[n]) for n in held):
        return None
    dims = {n: io_features(kids[n]) for n in held}
    first = {n: order.index(n) if n in order else -1 for n in held}
    for row, (inner, width) in sorted(dims.items()):
        cols = held - {row}
        if inner == width or not all(dims[n] == (width, inner) for n in cols):
            continue
        if all(0 <= first[n] < first[row] for n in cols):
            return {**{n: Kind.COLWISE for n in sorted(cols)}, row: Kind.ROWWISE}
    return None


def gathered_styles(module: Any, kids: Mapping[str, Any], order: Sequence[str]
                    ) -> dict[str, Kind] | None:
    """Each projection its own boundary, for a block that reads its input with Linears
    and writes its output with one Linear but computes between them what a split cannot
    run on shards (a norm over the whole width: BitNet's sub-norms; a fused q|k|v whose
    row order is the forward's own: CodeGen; a recurrent scan: Mamba-2's mixer): the input
    projections ``colwise_gather_output`` (their output all-gathered), the output
    projection ``rowwise_split_input`` (its partial output all-reduced). Exact whatever
    runs between them; the weights of every projection are split. None when the block has
    no such projections.

    The input projections are applied to the forward's own input (by name, in the forward
    or the method it hands its input to); the output projection is not, maps back to the
    width they read, and is called after them (``order``: as in :func:`mlp_styles`). A
    block whose input projections feed no output projection of its own (BERT's
    self-attention: query, key, value) has none."""
    from hpcodegen.generate.seeds.module_facts import forward_source

    held = _held(kids)
    linears = {n: io_features(kids[n]) for n in held if is_linear(kids[n])}
    if len(linears) < 2:
        return None
    order = [n for n in order if n in held]
    if not order or order[0] not in linears:
        return None  # the block's input is not read by a projection
    readers = input_readers(forward_source(module))
    outs = [o for o, (_, width) in linears.items() if o not in readers
            and all(dims[0] == width and n in readers for n, dims in linears.items() if n != o)]
    outs = [o for o in outs if o in order and all(
        n in order and order.index(n) < order.index(o) for n in linears if n != o)]
    if len(outs) != 1:
        return None
    return {**{n: Kind.COLWISE_GATHER for n in sorted(linears) if n != outs[0]},
            outs[0]: Kind.ROWWISE_SPLIT}


def block_styles(module: Any, kids: Mapping[str, Any], by_shape: bool = True,
                 order: Sequence[str] = ()) -> dict[str, Kind] | None:
    """Megatron's styles for an attention or an MLP (``by_shape``: MLPs found by their
    shapes, else by :data:`MLP_SHAPES`), or None: not one, or not exactly splittable.
    With ``by_shape`` a block that is neither gets its projections split one by one where
    it has them (:func:`gathered_styles`). ``order``: the block's children in the order
    the traced forward entered them (none: no MLP by shape, no gathered split)."""
    from hpcodegen.generate.seeds.module_facts import forward_source, fused_blocks

    if _takes_second_stream(module):
        return None
    clean = "config.num_" not in forward_source(module) and fused_blocks(module) == 1
    styles = attention_styles(module, kids, by_shape) if clean else None
    if styles is None and clean and not any(True for _ in module.parameters(recurse=False)):
        styles = mlp_styles(kids, order) if by_shape else named_mlp_styles(kids)
    if styles is None and by_shape:
        styles = gathered_styles(module, kids, order)
    return styles


def block_assignments(modules: Mapping[str, Any], named: Collection[str],
                      by_shape: bool = True, flow: Flow | None = None
                      ) -> dict[str, Assignment]:
    """Assignments for every attention and MLP no module of ``named`` is at, inside or
    above (those rules win), outermost first; ``flow``: the model's traced forward, which
    orders each block's children (without it no block is matched by the order of its
    calls)."""
    taken = set(named)
    out: dict[str, Assignment] = {}
    for fqn, module in modules.items():
        if not fqn or any(f == fqn or f.startswith(f"{fqn}.") or fqn.startswith(f"{f}.")
                          for f in taken | set(out)):
            continue
        order = flow.child_order(fqn) if flow is not None else ()
        styles = block_styles(module, children(modules, fqn), by_shape, order)
        own = {n for n, _ in module.named_parameters(recurse=False)}
        for name, kind in (styles or {}).items():
            child = f"{fqn}.{name}"
            out[child] = Assignment(child, kind, 1, kind.value, SEED_RULE, param=name in own)
    return out


def plans_layers(model: Any, hf: Sequence[tuple[str, str]]) -> bool:
    """Whether transformers' plan ``hf`` names some module besides the output head (most
    families without a ``base_model_tp_plan`` still get the class's ``lm_head`` rule)."""
    from hpcodegen.generate.sources.globs import expand_glob

    modules = dict(model.named_modules())
    head = getattr(model, "get_output_embeddings", lambda: None)()
    heads = {fqn for fqn, m in modules.items() if m is head and head is not None}
    return any(set(expand_glob(glob, list(modules))) - heads for glob, _ in hf)


def structural_seeds(model: Any, hf: Sequence[tuple[str, str]], replaced: bool,
                     taken: Collection[str] = (), flow: Flow | None = None
                     ) -> dict[str, Assignment]:
    """The seed plan of a model transformers plans no layer of (``hf`` names at most the
    output head) and no package rule file replaces that plan for: Megatron's styles for
    every attention and MLP found by structure (module docstring) outside the modules
    ``taken`` (placed by package rules or a recipe, which win), the order of each block's
    calls read from ``flow`` (:func:`hpcodegen.generate.seeds.pair_seeds.seed_flow`).
    Empty otherwise."""
    if replaced or plans_layers(model, hf):
        return {}
    return block_assignments(dict(model.named_modules()), taken, flow=flow)


def kept_reason(module: Any, kids: Mapping[str, Any]) -> str:
    """Why an attention (a module holding :data:`ATTN_INPUTS`) was not split by heads."""
    from hpcodegen.generate.seeds.module_facts import forward_source, fused_blocks
    from hpcodegen.tracer.norms import is_norm

    if _takes_second_stream(module):
        return "it takes keys and values from a second input, whose gradient would stay partial"
    if "config.num_" in forward_source(module) or fused_blocks(module) > 1:
        return "its forward sizes heads from the config or cuts a fused output into blocks"
    heads = head_counts(module)
    if heads is None:
        return "it names no head counts to split by"
    outs = [n for n in ATTN_OUTPUTS if is_linear(kids.get(n))]
    extra = sorted(n for n in _held(kids) - {*ATTN_INPUTS, *outs}
                   if not (is_norm(kids[n]) and kids[n].weight.numel() == heads[2]))
    if extra:
        return (f"it holds {', '.join(extra)}, which a split by heads cannot place "
                "(not one norm over head_dim shared by every head)")
    return "its output projection or its own parameters are not one per head"


def seeds_note(model: Any, seeds: Mapping[str, Assignment], more: Sequence[str] = ()
               ) -> list[str]:
    """generate's line naming what the seeds split, and why an attention stayed whole;
    ``more``: what the dataflow changed (:mod:`hpcodegen.generate.seeds.pair_seeds`)."""
    from hpcodegen.generate.sources.globs import parent_of

    blocks = sorted({parent_of(f) for f in seeds})
    if not blocks:
        return []
    modules = dict(model.named_modules())
    kept = [(fqn, kept_reason(m, children(modules, fqn))) for fqn, m in modules.items()
            if fqn not in blocks and all(is_linear(children(modules, fqn).get(n))
                                         for n in ATTN_INPUTS)]
    note = (f"structural seeds: transformers ships no TP plan for this model; {len(blocks)} "
            f"attention/MLP module(s) found by structure and split (hpcodegen/generate/"
            f"seeds.py), e.g. {blocks[0]}")
    if kept:
        note += f"; {len(kept)} attention(s) kept whole, e.g. {kept[0][0]}: {kept[0][1]}"
    return ["; ".join([note, *more])]
