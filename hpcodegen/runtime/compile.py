"""``torch.compile`` a model parallelized by hpcodegen: per decoder layer or whole.

What makes it traceable is in the runtime itself: under ``torch.compiler.is_compiling()``
the lowered collectives are the functional ones of
``torch.distributed._functional_collectives`` inside per-transition autograd Functions
(:mod:`hpcodegen.runtime.collectives`), which dynamo puts into the graph, so the boundary
code adds no graph break to those of the transformers model itself
(``tests/runtime/test_compile.py`` counts them with ``torch._dynamo.explain``).

Compile after :func:`~hpcodegen.runtime.parallelize_from_generated` (the boundaries and
the sharded parameters must be in place), before the optimizer is built is not required:
``nn.Module.compile`` compiles in place, so parameter objects and state-dict keys do not
change. The recipe for a user script::

    parallelize_from_generated(model, mesh, artifact_dir)
    compile_parallelized(model, scope="layers")   # or scope="model"
    loss = ...; loss.backward(); optimizer.step()

``layers`` compiles each decoder layer (the entries of the model's largest
``nn.ModuleList``: torchtitan's default, one small graph reused per layer); ``model``
compiles the whole forward once. Measured on the bench's tiny Llama (4 layers, fake PG,
forward): ``model`` runs 20-35% faster per call than ``layers`` (the HF Python between
the layers, the mask and rotary set-up, is in the graph), but its compile time grows with
the depth (every layer is traced), where ``layers`` compiles one layer graph. ``layers``
stays the default for that reason; small or shallow models gain from ``model``.

Before compiling, the boundaries in scope get their compiled-model collectives
(:func:`bind_traced`): the same graph, fewer Python objects for dynamo to guard on every
call. On the bench model (whole-model scope) the guard tree shrinks from 2065 to 1730
nodes (the plain transformers model's has 1356), and the compiled forward runs about 4%
faster.

The compiled call itself takes plain tensors: each DTensor parameter in scope is swapped
for its local alias around it, in eager Python
(:func:`~hpcodegen.runtime.local_views.views_outside`), so no DTensor is a graph input or
guarded, and neither are the view hooks' objects. On the bench model (whole-model scope,
``tests/runtime/test_compile_dtensor.py`` checks the guard trees) dynamo's guards went from
3393 to 1328 (2245 to 1086 by its ``guard_count``), DTensor graph inputs of the
sequence-parallel example from 5 to 0; outside the call the parameters are DTensors as
before (clip, optimizers, DCP).
"""

from __future__ import annotations

from typing import Any

from torch import nn

SCOPES = ("layers", "model")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The entries of the largest ``nn.ModuleList`` of ``model`` (HF: ``model.layers``)."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            best = list(module)
    return best


def compile_parallelized(model: nn.Module, scope: str = "layers", **options: Any) -> nn.Module:
    """Compile ``model`` in place (``nn.Module.compile``) and return it.

    Args:
        scope: ``layers`` (each decoder layer) or ``model`` (the whole model).
        options: passed to ``torch.compile`` (``fullgraph``, ``backend``, ``mode``...).

    Raises:
        ValueError: an unknown scope, or ``layers`` on a model without a layer list.
    """
    if scope not in SCOPES:
        raise ValueError(f"compile scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if scope == "model":
        _compile_in_place(model, options, "")
        return model
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList of decoder layers: "
                         "compile it whole (scope='model')")
    names = {id(module): fqn for fqn, module in model.named_modules()}
    for layer in layers:
        _compile_in_place(layer, options, names[id(layer)])
    return model


def _compile_in_place(module: nn.Module, options: dict[str, Any], name: str) -> None:
    """``module.compile``, its parameters' local views swapped in outside the compiled call
    (:func:`~hpcodegen.runtime.local_views.views_outside`: no DTensor, no view hook traced);
    ``name``, the module's FQN, is what a refusal of that swap names."""
    from hpcodegen.runtime.local_views import views_outside

    bind_traced(module)
    module.compile(**options)
    module._compiled_call_impl = views_outside(module, module._compiled_call_impl, name)


def bind_traced(root: nn.Module) -> int:
    """Give every boundary under ``root`` its compiled-model collectives; how many.

    A generated boundary's ``_hp_tp``
    (:meth:`~hpcodegen.runtime.collectives.matching.TPOps.bind_traced`) and a wrapped
    module's forward (its ``_hp_traced_forward``, bound once): the ops dynamo
    puts in the graph are the same, the guards checked on every call fewer.
    """
    from hpcodegen.runtime.collectives.matching import TPOps

    bound = 0
    for module in root.modules():
        ops = module.__dict__.get("_hp_tp")
        if isinstance(ops, TPOps) and ops.bind_traced():
            bound += 1
        rebuild = module.__dict__.pop("_hp_traced_forward", None)
        if rebuild is not None:
            module.forward = rebuild()
            bound += 1
    return bound
