"""``Artifact.from_pretrained``: a checkpoint's weights, sharded onto the user's own mesh.

The same sharded load ``hpcodegen launch`` runs (:mod:`hpcodegen.checkpoint.shard_load`):
the model is built with its parameters on the meta device, the plan is installed over the
plan's axes of the caller's mesh, and only then is each rank's local shard allocated and
read from the safetensors files, so no rank ever holds the full model. The mesh is the
caller's: its plan axes must be the plan's sizes; its other dims (``dp``) are left alone,
for FSDP2 or the caller's own data parallelism.

Every input is checked before anything is built, each refusal naming what was expected:
the directory (a config and weights), the config (the artifact's model, in its shape) and
the mesh (the plan's axes and sizes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcodegen.errors import InputError, PlanError, error
from hpcodegen.plan.types import Plan

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from hpcodegen.runtime.artifact import Artifact


def pretrained_dir(model_dir: str | os.PathLike[str]) -> Path:
    """``model_dir`` as a local directory: a path as is, a Hub id (``org/name``) from the
    local Hugging Face cache only; InputError when it is neither."""
    from hpcodegen.hf import resolve_model_dir

    if not isinstance(model_dir, (str, os.PathLike)):
        raise InputError([error("pretrained.bad_path", "model_dir",
                                f"not a path: got {type(model_dir).__name__}",
                                expected="a directory holding config.json and *.safetensors, "
                                         "or a Hub id in the local cache")])
    directory = resolve_model_dir(model_dir)
    if not directory.is_dir():
        raise InputError([error("pretrained.not_a_dir", str(directory),
                                "no such model directory",
                                expected="a directory holding config.json and *.safetensors "
                                         "(what save_pretrained writes)",
                                file=str(directory))])
    return directory


def check_mesh(plan: Plan, mesh: Any, artifact: str) -> None:
    """Refuse a mesh that lacks the plan's axes or sizes them otherwise.

    Every plan axis frozen at a size above 1 (``tp=2``) must be a named dim of ``mesh`` of
    that size; a dim of a plan axis frozen at 1 must be of size 1. Data-parallel dims
    (``dp``...) are the caller's and are not compared.
    """
    from hpcodegen.plan.revalidate import FSDP_AXES
    from hpcodegen.runtime.mesh import as_context

    device_mesh = as_context(mesh).device_mesh
    names = tuple(device_mesh.mesh_dim_names or ())
    shape = dict(zip(names, device_mesh.mesh.shape, strict=False))
    want = {a: plan.dims.size(a) for a in plan.axes if a not in FSDP_AXES}
    wanted = ", ".join(f"{a}={s}" for a, s in want.items()) or "none"
    problems = []
    for axis, size in want.items():
        got = shape.get(axis)
        if got is None and size > 1:
            problems.append(error(
                "pretrained.mesh_axis_missing", "mesh",
                f"the mesh's dims {names or '(unnamed)'} have no {axis!r}: the artifact "
                f"{artifact} shards over {axis}={size}",
                expected=f"a mesh with the named dim {axis!r} of size {size} (plan axes: "
                         f"{wanted}); other dims such as 'dp' are yours",
                hint=f"init_device_mesh(device, (dp, {size}), mesh_dim_names=('dp', "
                     f"{axis!r}))"))
        elif got is not None and got != size:
            problems.append(error(
                "pretrained.mesh_axis_size", f"mesh[{axis!r}]",
                f"the mesh's {axis!r} dim has size {got}, the artifact {artifact} was "
                f"frozen for {axis}={size}",
                expected=f"{axis} of size {size} (plan axes: {wanted})",
                hint=f"build the mesh with {axis}={size}, or generate an artifact for "
                     f"{axis}={got}"))
    if problems:
        raise PlanError(problems)


def _device_of(mesh: Any) -> Any:
    """The device this rank's shards live on: the mesh's device type (this rank's
    accelerator index where there is one)."""
    import torch

    kind = mesh.device_type
    if kind == "cpu":
        return torch.device("cpu")
    module = getattr(torch, kind, None)
    index = module.current_device() if module is not None and hasattr(
        module, "current_device") else None
    return torch.device(kind, index)


def load_pretrained(art: Artifact, model_dir: str | os.PathLike[str], *, mesh: DeviceMesh,
                    dtype: Any = None) -> nn.Module:
    """:meth:`hpcodegen.runtime.artifact.Artifact.from_pretrained` (see there)."""
    import torch

    from hpcodegen.checkpoint.layout import ShardLayout, global_shapes
    from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint
    from hpcodegen.checkpoint.shard_load import materialize, parameters_on_meta
    from hpcodegen.hf import load_transformers_config, read_hf_config
    from hpcodegen.runtime.mesh import as_context

    directory = pretrained_dir(model_dir)
    config, _ = read_hf_config(directory)
    checkpoint = SafetensorsCheckpoint(directory)
    if not checkpoint:
        raise InputError([error("pretrained.no_weights", str(directory),
                                "the model directory holds no safetensors weights",
                                expected="*.safetensors files (model.safetensors, or shards "
                                         "with model.safetensors.index.json)",
                                hint="save them with model.save_pretrained(dir) "
                                     "(safe_serialization, the default)",
                                file=str(directory))])
    # the config as written: the artifact's signature hashes its fields, not the defaults
    # and attribute aliases ``PretrainedConfig.to_dict`` adds
    checked = art.with_config(config)
    context = as_context(mesh)
    check_mesh(checked.plan, context, str(art.directory))
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise PlanError([error("pretrained.bad_dtype", "dtype",
                               f"not a torch dtype: {dtype!r}",
                               expected="torch.float32, torch.bfloat16 or torch.float16")])
    device = _device_of(context.device_mesh)
    hf_config = load_transformers_config(config)
    with parameters_on_meta():
        model = checked.model_class()(hf_config)
    shapes = global_shapes(model)
    info = checked.install(model, context)
    layout = ShardLayout.from_model(model, shapes, info)
    materialize(model, layout, dtype=dtype or torch.float32, device=device,
                checkpoint=checkpoint)
    model = model.to(device=device)  # the buffers
    model.eval()  # as transformers' from_pretrained: no dropout until model.train()
    return model
