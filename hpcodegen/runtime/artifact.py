"""``hpcodegen.Artifact``: load and check an artifact once, build its model, parallelize it.

::

    art = Artifact.load("examples/llama_tp2", hf_config=config)  # checked once, holds the Plan
    model = art.build_model(device="cpu")                        # the generated class
    model = art.parallelize(model, mesh)                         # local shards, boundaries
    dcp.save(model.state_dict(), checkpoint_id="ckpt")           # DTensors: reshards on load

    model = Artifact.load("examples/llama_tp2").from_pretrained(hf_dir, mesh=mesh)

``Artifact.load`` is the one way the library reads an artifact: launch ranks, the parity
harness and the runtime API all go through it.

The loading is verify's (schema, plan, injection targets, output hashes; with a config its
architecture and signature), done once: building and parallelizing read the same checked
:class:`~hpcodegen.plan.types.Plan`, and the generated module is imported from exactly the
bytes whose hashes were checked. torch is imported by :meth:`Artifact.build_model` and
:meth:`Artifact.parallelize` only.
"""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcodegen.artifact.load import LoadedMeta
from hpcodegen.errors import PlanError, error
from hpcodegen.plan.types import Plan

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

_DONE = "_hp_parallelized"


@dataclass(frozen=True)
class Artifact:
    """A checked codegen artifact (build it with :meth:`load`).

    Attributes:
        loaded: the meta as read and checked (``loaded.plan`` is :attr:`plan`).
        hf_config: the config it was checked against (a ``PretrainedConfig``, a dict or a
            path, as given), or None.
        allowed_target_prefixes: module prefixes trusted for injection targets.
    """

    loaded: LoadedMeta
    hf_config: Any = None
    allowed_target_prefixes: tuple[str, ...] = ()
    _module: list[types.ModuleType] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def load(cls, directory: str | os.PathLike[str], hf_config: Any = None, *,
             allowed_target_prefixes: Sequence[str] = ()) -> Artifact:
        """Read and check the artifact at ``directory``, once.

        Args:
            directory: the artifact directory (or its ``codegen_meta.json``).
            hf_config: the model's config (``PretrainedConfig``, dict, or a path to
                ``config.json`` or its directory): another architecture or shape is refused.
            allowed_target_prefixes: module prefixes you trust for injection targets
                (:mod:`hpcodegen.targets`).

        Raises:
            InputError: (exit 2) the meta cannot be read.
            PlanError: (exit 1) a check failed (drifted file, foreign target, other model).

        Example::

            art = Artifact.load("examples/llama_tp2", "examples/configs/llama")
            art.plan.axes          # ("tp",)
        """
        from hpcodegen.runtime.checked import load_verified_meta

        prefixes = tuple(allowed_target_prefixes)
        loaded = load_verified_meta(directory, hf_config, allowed_target_prefixes=prefixes)
        return cls(loaded, hf_config, prefixes)

    def with_config(self, hf_config: Any) -> Artifact:
        """This artifact checked against a model's config, on the bytes already read.

        The architecture and verify's ``signature`` check
        (:func:`hpcodegen.runtime.checked.check_config`); nothing is read again, and the
        generated module, once imported, is shared.

        Raises:
            PlanError: a config of another model (the artifact's is named).
        """
        from hpcodegen.runtime.checked import check_config

        loaded = check_config(self.loaded, hf_config)
        return Artifact(loaded, hf_config, self.allowed_target_prefixes, self._module)

    @property
    def plan(self) -> Plan:
        """The typed plan (built once by the loader)."""
        assert self.loaded.plan is not None  # load_verified_meta builds it
        return self.loaded.plan

    @property
    def directory(self) -> Path:
        return self.loaded.artifact_dir

    def module(self) -> types.ModuleType:
        """The generated modeling module, imported once from the checked bytes."""
        if not self._module:
            from hpcodegen.runtime.loader import import_verified_module

            self._module.append(import_verified_module(
                self.loaded, allowed_target_prefixes=self.allowed_target_prefixes))
        return self._module[0]

    def model_class(self) -> type:
        """The generated module's model class (``model_class``, else ``source.architecture``)."""
        from hpcodegen.runtime.loader import generated_model_class

        return generated_model_class(self.plan, self.module())

    def build_model(self, device: Any = None, *, dtype: Any = None) -> nn.Module:
        """The unsharded model of the generated class, from the config given to :meth:`load`.

        Args:
            device: where its tensors are allocated (``"cpu"``, ``"cuda"``, ``"meta"``...;
                default: torch's default device).
            dtype: a torch dtype for the floating-point parameters (default: the class's).

        Raises:
            PlanError: :meth:`load` was given no config.
        """
        import torch

        config = self._transformers_config()
        with torch.device(device) if device is not None else _nothing():
            model = self.model_class()(config)
        if dtype is not None:
            for param in model.parameters():
                if param.is_floating_point():
                    param.data = param.data.to(dtype)
        return model

    def _transformers_config(self) -> Any:
        config = self.hf_config
        if config is None:
            raise PlanError([error("runtime.no_config", str(self.directory),
                                   "build_model needs the model's config",
                                   hint="Artifact.load(directory, hf_config=...)")])
        if hasattr(config, "to_dict"):
            return config
        from hpcodegen.hf import load_transformers_config
        from hpcodegen.runtime.checked import config_dict

        return load_transformers_config(config_dict(config))

    def parallelize(self, model: nn.Module, mesh: DeviceMesh, *,
                    fsdp_mesh: DeviceMesh | None = None,
                    expert_mesh: DeviceMesh | None = None) -> nn.Module:
        """Install the plan on ``model`` in place and return it.

        1. Refuse a second call, a model that is not an ``nn.Module``, an unknown special
           handler, a foreign injection target, a loss-parallel plan the model's forward
           would make inexact; nothing is mutated before these pass.
        2. Import the generated module (the checked bytes); a function it defines under the
           meta's ``entrypoints.parallelize`` is never called: the plan is what runs.
        3. Resolve the active submesh (plan axes in the live order, size-1 axes dropped).
           None left (tp=1, or tp absent): an exact no-op (a warning when the mesh has none
           of the plan's axes).
        4. The phases of :mod:`hpcodegen.runtime.install`.

        Args:
            model: built from :meth:`build_model` (or the transformers class).
            mesh: the device mesh with named axes holding the plan's (``("dp", "tp")``...).
            fsdp_mesh: the mesh FSDP2 will shard over, when it holds the plan axes (the
                source info names its submesh).
            expert_mesh: a mesh named ``("ep",)`` or ``("ep", "tp")`` for expert parameters
                (default: ``mesh``'s ``ep`` axis).

        Returns:
            ``model``: every planned parameter a DTensor with the plan's placements (the
            forwards compute on its local view), so ``model.state_dict()``, torch's
            ``clip_grad_norm_``, optimizers, DCP and FSDP2 see the unsharded model.
        """
        from hpcodegen.runtime.mesh import MeshContext

        self.install(model, MeshContext(mesh, fsdp_mesh, expert_mesh))
        return model

    def from_pretrained(self, model_dir: str | os.PathLike[str], *, mesh: DeviceMesh,
                        dtype: Any = None) -> nn.Module:
        """The model of ``model_dir`` (config and safetensors weights), parallelized on
        ``mesh``; each rank reads only its own shards of the weights.

        Args:
            model_dir: a directory holding ``config.json`` and ``*.safetensors`` (one file,
                or shards with their index), or a Hub id (``org/name``) already in the local
                Hugging Face cache (nothing is downloaded).
            mesh: your ``DeviceMesh``; the plan's axes (``"tp"``...) are named dims of the
                plan's sizes, other dims (``"dp"``) are yours, e.g. FSDP2 over
                ``mesh["dp"]``.
            dtype: a torch dtype for the floating-point parameters (default float32).

        Returns:
            The parallelized model of the generated class, in eval mode (as transformers'
            ``from_pretrained`` returns it): call ``model.train()`` to fine-tune.

        Raises:
            InputError: (exit 2) no config or no weights in ``model_dir``, a Hub id not in
                the local cache.
            PlanError: (exit 1) a config of another model than the artifact's, a mesh
                without the plan's axes or of other sizes, weights of other names or shapes.

        Example::

            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            model = Artifact.load("examples/llama_tp2").from_pretrained("ckpt", mesh=mesh)
        """
        from hpcodegen.runtime.pretrained import load_pretrained

        return load_pretrained(self, model_dir, mesh=mesh, dtype=dtype)

    def install(self, model: nn.Module, context: Any) -> dict[str, tuple[tuple, Any]]:
        """:meth:`parallelize` with a :class:`~hpcodegen.runtime.mesh.MeshContext`;
        returns the FSDP2 source info (``{}`` for a no-op install)."""
        from hpcodegen.runtime.experts import resolve_expert_mesh
        from hpcodegen.runtime.install import install
        from hpcodegen.runtime.mesh import as_context, resolve_active_mesh

        resolved = self._refusals(model)
        self.module()
        context = as_context(context)
        setattr(model, _DONE, True)
        active = resolve_active_mesh(self.plan, context)
        expert = resolve_expert_mesh(self.plan, context.device_mesh, context.expert_mesh)
        if active.degenerate and expert is None:
            _warn_without_plan_axes(self.plan, context)
            return {}
        return install(model, self.plan, active, resolved, expert)

    def _refusals(self, model: Any) -> Any:
        from torch import nn

        from hpcodegen.artifact.digest import is_hpcodegen_meta
        from hpcodegen.runtime.handlers import check_handlers
        from hpcodegen.runtime.install import Resolved
        from hpcodegen.runtime.loss_install import check_loss_parallel_install
        from hpcodegen.targets import resolve_injections

        if not isinstance(model, nn.Module):
            raise PlanError([error("runtime.bad_model", "model",
                                   f"expected a torch.nn.Module, got {type(model).__name__}",
                                   hint="build the model with Artifact.build_model")])
        if getattr(model, _DONE, False):
            raise PlanError([error("runtime.second_call", type(model).__name__,
                                   "the model is already parallelized")])
        from hpcodegen.runtime.model_fit import model_fit_findings

        misfit = model_fit_findings(model, self.plan)
        if misfit:
            raise PlanError(misfit)
        meta = self.loaded.data
        handlers = check_handlers(self.plan)
        injections = resolve_injections(self.plan, self.allowed_target_prefixes)
        check_loss_parallel_install(model, self.plan, is_hpcodegen_meta(meta))
        return Resolved(handlers, injections)


def _nothing() -> Any:
    from contextlib import nullcontext

    return nullcontext()


def _warn_without_plan_axes(plan: Plan, context: Any) -> None:
    """A mesh with none of the plan's axes installs nothing, by design (decisions.md 4);
    say so, since a mesh named ``("dp",)`` or ``("model",)`` is more often a mistake than
    a wish for an unsharded model. A plan axis of size 1 (tp=1) stays silent."""
    names = tuple(context.device_mesh.mesh_dim_names or ())
    if plan.axes and not set(plan.axes) & set(names):
        warnings.warn(f"the device mesh {names} has none of the artifact's axes "
                      f"{plan.axes}: nothing is sharded, the model runs unparallelized",
                      UserWarning, stacklevel=4)
