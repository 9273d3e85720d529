"""Build a model without memory for its parameters, then give each rank only its shards.

``parameters_on_meta()`` constructs the model with every parameter on the meta device
(buffers stay real: rotary ``inv_freq`` and friends are computed in ``__init__`` and are
not in checkpoints). ``parallelize_from_generated`` shards meta parameters to their local
meta shapes, and :func:`materialize` finally allocates each local shard and fills it: from
a safetensors checkpoint (only this rank's slice is read), or left empty for a
``torch.distributed.checkpoint`` load to fill in place.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout
from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint
from hpcodegen.errors import PlanError, error


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every ``nn.Parameter`` registered inside the block lands on the meta device.

    Constructors still allocate each parameter briefly (``torch.empty``, never touched)
    before it moves to meta, so their init functions run on meta tensors at no cost.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.detach().to("meta"),
                                                    requires_grad=param.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def _source_name(fqn: str, names: list[str], checkpoint: SafetensorsCheckpoint) -> str | None:
    return next((n for n in [fqn, *names] if n in checkpoint), None)


def _check_names(model: nn.Module, layout: ShardLayout,
                 checkpoint: SafetensorsCheckpoint) -> dict[str, str]:
    """``{canonical fqn: name in the checkpoint}``; a clear error for missing, unexpected
    or wrongly shaped tensors (all listed, a few by name)."""
    aliases: dict[str, list[str]] = {}
    for alias, canonical in layout.aliases.items():
        aliases.setdefault(canonical, []).append(alias)
    sources, missing, wrong = {}, [], []
    for fqn, spec in layout.params.items():
        name = _source_name(fqn, aliases.get(fqn, []), checkpoint)
        if name is None:
            missing.append(fqn)
            continue
        shape = checkpoint.tensors[name].shape
        if shape != spec.global_shape:
            wrong.append(f"{name}: file {shape}, model {spec.global_shape}")
        sources[fqn] = name
    buffers = {n: tuple(b.shape) for n, b in model.named_buffers()}
    wrong += [f"{n}: file {checkpoint.tensors[n].shape}, model {shape}"
              for n, shape in buffers.items()
              if n in checkpoint and checkpoint.tensors[n].shape != shape]  # never broadcast
    unexpected = [n for n in checkpoint.tensors
                  if n not in sources.values() and n not in buffers and n not in layout.aliases]
    where = str(checkpoint.directory)
    if wrong:
        more = f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise PlanError([error("launch.weights_shape", where,
                               f"weights of another shape than the model: "
                               f"{'; '.join(wrong[:3])}{more}",
                               hint="--model-dir must hold the config the weights were saved "
                                    "with")])
    if missing or unexpected:
        raise PlanError([error("launch.weights", where,
                               f"weights do not match the model: missing {missing[:3]} "
                               f"({len(missing)}), unexpected {unexpected[:3]} "
                               f"({len(unexpected)})")])
    return sources


def _install(model: nn.Module, fqn: str, local: torch.Tensor) -> None:
    """Put ``local`` into the parameter object itself (tied aliases see it too); it keeps
    its kind (a runtime DTensor parameter stays one, on its mesh), its recorded spec and
    its ``_hp_*`` attributes.

    ``swap_tensors`` swaps the tensors' implementations: the gradient hooks the runtime
    registered on the old one (tp-partial gradients' sync, expert gradients' scale) are
    inert afterwards; :func:`materialize` re-hooks the new ones once every parameter is in
    (:func:`hpcodegen.runtime.param_hooks.refresh_param_hooks`), before any forward.
    """
    from hpcodegen.runtime.shards import remember, spec_of

    param = model.get_parameter(fqn)
    new = nn.Parameter(_like(param, local), requires_grad=param.requires_grad)
    for name, value in vars(param).items():
        if name.startswith("_hp_"):
            setattr(new, name, value)
    spec = spec_of(param)
    if spec is not None:
        remember(new, spec)
    torch.utils.swap_tensors(param, new)


def _like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as ``param`` holds its values: a DTensor parameter's new local shard
    (its mesh, placements and global shape), else ``local``."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


def materialize(model: nn.Module, layout: ShardLayout, *, dtype: torch.dtype,
                device: Any, checkpoint: SafetensorsCheckpoint | None = None,
                params: Collection[str] | None = None, source: nn.Module | None = None
                ) -> None:
    """Allocate every parameter's local shard; fill it from ``checkpoint`` when given.

    Collective when the layout has strided shards (``SS(d,f)``): those are read whole and
    cut by ``distribute_tensor`` (every rank visits the parameters in the same order).

    Floating-point tensors become ``dtype``; persistent buffers found in the checkpoint
    are loaded whole. Each local shard is allocated first, then filled through
    :func:`copy_into` (one tensor read at a time). Without a checkpoint the shards are
    uninitialised (for :func:`hpcodegen.checkpoint.resume`), or filled from ``source``: a
    model of the same class holding every parameter whole (the seeded init the unsharded
    reference builds), sliced as a checkpoint would be.

    ``params`` (FQNs, tied aliases allowed; default all) are the parameters allocated: a
    pipeline rank's stages' own. The others stay on the meta device as built, never read,
    never allocated.
    """
    sources = _check_names(model, layout, checkpoint) if checkpoint is not None else {}
    wanted = None if params is None else {layout.aliases.get(f, f) for f in params}
    for fqn in layout.params:
        param = model.get_parameter(fqn)
        want = dtype if param.is_floating_point() else param.dtype
        if wanted is not None and fqn not in wanted:
            continue  # another pipeline stage's: stays on meta
        _install(model, fqn, torch.empty(layout.local_shape(fqn), dtype=want, device=device))
        if checkpoint is None and source is None:
            continue

        def read(index: tuple[slice, ...] | None, fqn: str = fqn, want: Any = want) -> Any:
            if checkpoint is not None:
                return checkpoint.read(sources[fqn], index, dtype=want, device=device)
            whole = source.get_parameter(fqn).detach()  # type: ignore[union-attr]
            return (whole if index is None else whole[index]).to(dtype=want, device=device)

        if layout.is_strided(fqn):  # f pieces, not one slice: torch cuts them (collective)
            from torch.distributed.tensor import distribute_tensor

            spec = layout.params[fqn]
            full = read(None)
            local = distribute_tensor(full, spec.mesh, list(spec.placements)).to_local()
            del full
        else:
            local = read(layout.local_slices(fqn))
        copy_into(model.get_parameter(fqn), local)
        del local
    from hpcodegen.runtime.param_hooks import refresh_param_hooks

    refresh_param_hooks(model)  # _install swapped the parameters' tensors
    if checkpoint is not None:
        for name, buf in model.named_buffers():
            if name in checkpoint:
                copy_into(buf, checkpoint.read(name, dtype=buf.dtype, device=buf.device))


def copy_into(target: torch.Tensor, value: torch.Tensor) -> None:
    """Write ``value`` into a parameter or buffer in place: into its local shard
    (``to_local()``) when it is a DTensor, into the tensor itself otherwise.

    The one way loaded weights enter a model: the tensor object, its hooks and whatever
    aliases it (tied weights, an optimizer's references) stay the same.
    """
    from torch.distributed.tensor import DTensor

    local = target.to_local() if isinstance(target, DTensor) else target
    if tuple(local.shape) != tuple(value.shape):
        raise PlanError([error("launch.weights_shape", "", f"a local shard of shape "
                               f"{tuple(value.shape)} for a tensor of local shape "
                               f"{tuple(local.shape)}")])
    with torch.no_grad():
        local.copy_(value)
