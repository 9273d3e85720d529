"""What a module's class and forward say about it (lazy torch: works on a meta model).

The structural facts generate's passes read: a forward's first input, a Linear's weight
layout, the parameters a module holds itself, the head counts and fused blocks its forward
(and the methods it calls) uses, and which modules are per-token lookups (which are norms
is the tracer's: :mod:`hpcodegen.tracer.norms`). Split
out of :mod:`hpcodegen.generate.layouts.lift`; the seeds, the Megatron layouts and the lifter all
read them from here.
"""

from __future__ import annotations

import inspect
import re
import weakref
from typing import Any

from hpcodegen.errors import PlanError, error


def first_arg(module: Any) -> str:
    """The name of the first parameter of ``type(module).forward`` after ``self``."""
    params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return p.name
    raise PlanError([error("generate.no_input", type(module).__name__,
                           f"{type(module).__name__}.forward has no positional input to place")])


def linear_dims(module: Any) -> tuple[int, int]:
    """``(output-feature dim, input-feature dim)`` of a Linear-like module's weight.

    ``nn.Linear`` stores ``(out, in)``; transformers' ``Conv1D`` (GPT-2 family) stores the
    transpose ``(in, out)`` and names its output width ``nf``.
    """
    weight = getattr(module, "weight", None)
    nf = getattr(module, "nf", None)
    shape = tuple(getattr(weight, "shape", ()))
    if isinstance(nf, int) and len(shape) == 2 and shape[1] == nf and shape[0] != nf:
        return 1, 0
    if isinstance(nf, int) and len(shape) == 2 and type(module).__name__ == "Conv1D":
        return 1, 0
    return 0, 1


def direct_params(module: Any) -> list[str]:
    """Names of the parameters a module holds itself (not its children's)."""
    return [name for name, p in module.named_parameters(recurse=False) if p is not None]


def head_count_attrs(module: Any) -> list[str]:
    """Integer attributes naming head counts that the class's forward reads.

    The runtime divides them by tp (each rank holds heads/tp heads). transformers 5.x
    attention reshapes with ``-1`` and keeps none, so this is usually ``[]``. Methods of
    the class that the forward calls (``self._split_heads(...)``: Persimmon, GPT-NeoX
    Japanese) read them on its behalf, so their source counts too.
    """
    source = forward_source(module)
    return sorted(
        name for name, value in vars(module).items()
        if "heads" in name and isinstance(value, int) and not isinstance(value, bool)
        and f"self.{name}" in source
    )


def forward_source(module: Any) -> str:
    """The source of ``type(module).forward`` and of the methods it calls on ``self``
    (transitively), "" when unavailable.

    Read once per class (:data:`_SOURCES`): every module of a model's stack shares its
    class, and the passes of one generate ask for each module's source many times
    (finding and reading the source was a tenth of a build). A hit is checked against the
    methods it was read from, so a class whose method was since replaced is read again."""
    cls = type(module)
    hit = _SOURCES.get(cls)
    if hit is not None and all(_method(cls, name) is (ref() if ref else None)
                               for name, ref in hit[0]):
        return hit[1]
    seen: set[str] = set()
    texts: list[str] = []
    read: list[tuple[str, Any]] = []
    todo = ["forward"]
    while todo:
        name = todo.pop()
        if name in seen or name == "__init__":
            continue
        seen.add(name)
        fn = getattr(cls, name, None)
        method = _method(cls, name)
        read.append((name, weakref.ref(method) if method is not None else None))
        try:
            text = inspect.getsource(fn) if callable(fn) else ""
        except (OSError, TypeError):
            text = ""
        texts.append(text)
        # methods only: submodules (``self.q_proj(x)``) are instance attributes
        todo.extend(m for m in re.findall(r"self\.(\w+)\(", text)
                    if callable(getattr(cls, m, None)))
    source = "\n".join(texts)
    _SOURCES[cls] = (tuple(read), source)
    return source


def _method(cls: type, name: str) -> Any:
    """The function ``cls.<name>`` runs (a classmethod's, not a fresh bound method), or
    None: what a cached :func:`forward_source` is checked against. Functions only (they
    take weak references); anything else is None."""
    fn = getattr(cls, name, None)
    fn = getattr(fn, "__func__", fn)
    return fn if inspect.isfunction(fn) else None


#: class -> ((method name, weak reference to the function read or None), ...) and the
#: source :func:`forward_source` read from them; weak: a class made by a test goes away
_SOURCES: weakref.WeakKeyDictionary[type, tuple[tuple[tuple[str, Any], ...], str]] = \
    weakref.WeakKeyDictionary()


#: a projection's output cut into equal blocks on the last dim (a fused gate|up)
_CHUNK_LAST = re.compile(r"\bchunk\(\s*(?:[\w.]+\s*,\s*)?(\d+)\s*,\s*(?:dim\s*=\s*)?-1\s*\)")


def fused_blocks(module: Any) -> int:
    """How many blocks the forward (and the methods it calls) cuts a projection's output into
    on the last dim (``gate, up = x.chunk(2, dim=-1)``: 2); 1 when it cuts none, or cuts
    into differing counts (ambiguous: nothing is assumed)."""
    counts = {int(n) for n in _CHUNK_LAST.findall(forward_source(module))}
    return counts.pop() if len(counts) == 1 else 1


def call_model(model: Any, name: str) -> Any:
    fn = getattr(model, name, None)
    try:
        return fn() if callable(fn) else None
    except (NotImplementedError, AttributeError):
        return None


def holds_weight(module: Any) -> bool:
    return "weight" in direct_params(module)


def is_lookup_embedding(module: Any) -> bool:
    """An ``nn.Embedding`` (or subclass): a per-token lookup whose output is its ids' shape
    plus the embedding width, so ``(batch, seq)`` ids give a sequence on dim 1 (GPT-2's
    ``wpe`` position embedding, token-type or per-layer embeddings)."""
    return any(c.__name__ == "Embedding" and c.__module__.startswith("torch.nn")
               for c in type(module).__mro__)
