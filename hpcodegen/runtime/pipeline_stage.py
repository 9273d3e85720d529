"""One pipeline stage of an HF causal LM, cut by the frozen module FQNs (torch).

A stage is a *shell* of the model: the same module tree and the same parameter objects
(so FQNs, tied weights and the tp plan installed on the full model stay as they are), with
every unit the stage does not own replaced by a parameter-free stand-in:

* a layer -> :class:`PassThrough` (returns its hidden states; keeps the layer's plain
  attributes, e.g. ``attention_type``, that the model's layer loop reads);
* a unit after the layers (final norm, head) -> ``nn.Identity``;
* a unit before the layers (embeddings) -> :class:`Absent` (never called: a later stage
  feeds the base model ``inputs_embeds``).

The first stage calls the base model (the module holding the layer list) on token ids;
a middle stage calls it on the received hidden states as ``inputs_embeds`` (positions,
masks and rotary embeddings are rebuilt from their shape, as the section's
``side_inputs`` say); the last stage calls the top model so its own head and output
processing (logit soft-capping, scaling) run, and returns the logits.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from hpcodegen.plan.pipeline import Pipeline
from hpcodegen.runtime.cp.context import cp_call, cp_state


class PassThrough(nn.Module):
    """A layer another stage runs: hidden states in, the same hidden states out."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        for key, value in vars(layer).items():
            if not key.startswith("_") and not isinstance(value, (nn.Module, torch.Tensor)):
                setattr(self, key, value)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class Absent(nn.Module):
    """A module another stage owns; calling it here is a bug in the stage cut."""

    def __init__(self, fqn: str) -> None:
        super().__init__()
        self.fqn = fqn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.fqn} belongs to another pipeline stage")


def _layer_base(pipe: Pipeline) -> tuple[str, str]:
    """``(the layer list's FQN, the base model's FQN)`` from the frozen units."""
    lists = {fqn.rpartition(".")[0] for fqn in pipe.module_order or ()
             if fqn.rpartition(".")[2].isdigit()}
    if len(lists) != 1:
        raise ValueError(f"expected one layer list among the pipeline units, got {sorted(lists)}")
    layer_list = lists.pop()
    return layer_list, layer_list.rpartition(".")[0]


def _shell(module: nn.Module) -> nn.Module:
    """A shallow copy of ``module`` whose child/parameter/buffer tables are its own.

    The sequence-parallel positions wrapper (an instance ``forward`` closing over the
    original module) is not copied: it would run the whole model; :class:`StageModule`
    passes the global positions itself."""
    clone = copy.copy(module)
    clone._modules = type(module._modules)(module._modules)
    clone._parameters = type(module._parameters)(module._parameters)
    clone._buffers = type(module._buffers)(module._buffers)
    if getattr(module, "_hp_position_ids_wrapped", False):
        del clone.forward
        clone._hp_position_ids_wrapped = False
    if cp_state(module) is not None and "forward" in clone.__dict__:
        del clone.forward  # the cp root wrapper: StageModule reads the batch view itself
    return clone


def _cut(module: nn.Module, prefix: str, owned: set[str], units: list[str],
         layer_list: str) -> nn.Module:
    """The shell of ``module`` (at ``prefix``) keeping only ``owned`` units."""
    out = _shell(module)
    first_layer = next(i for i, u in enumerate(units) if u.startswith(f"{layer_list}."))
    for name, child in module.named_children():
        fqn = f"{prefix}.{name}" if prefix else name
        if fqn in owned or child is None:
            continue
        if fqn == layer_list:
            out._modules[name] = nn.ModuleList(
                layer if f"{fqn}.{i}" in owned else PassThrough(layer)
                for i, layer in enumerate(child))
        elif fqn in units:
            after = units.index(fqn) > first_layer
            out._modules[name] = nn.Identity() if after else Absent(fqn)
        elif any(u.startswith(f"{fqn}.") for u in units):
            out._modules[name] = _cut(child, fqn, owned, units, layer_list)
    return out


class StageModule(nn.Module):
    """The module a ``torch.distributed.pipelining.PipelineStage`` runs for one stage."""

    def __init__(self, top: nn.Module, base_fqn: str, *, first: bool, last: bool,
                 seq_shards: int = 1) -> None:
        super().__init__()
        self.top = top
        self.base_fqn = base_fqn
        self.first, self.last = first, last
        self.seq_shards = seq_shards
        """tp when the boundary is sequence-sharded (``S(1)`` on tp): a received
        activation holds ``1/seq_shards`` of the sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": x} if self.first else {"inputs_embeds": x}
        kwargs["use_cache"] = False
        state = cp_state(self.top)
        shards = 1 if self.first else self.seq_shards  # token ids are never tp-sharded
        if state is None and self.seq_shards == 1:
            return self._run(kwargs)
        if state is not None and self.seq_shards == 1:  # this cp rank's positions
            return cp_call(state, lambda **kw: self._run(kw), kwargs)
        from hpcodegen.sp_positions import full_sequence

        # sequence parallel: the masks (and, without cp, the positions) span the rank's
        # whole sequence, as the first stage's forward sees it; under cp that is its cp
        # shard, whose positions the cp batch view gives
        length = x.shape[1] * shards
        with full_sequence(length):
            if state is not None:
                return cp_call(state, lambda **kw: self._run(kw), kwargs, shards)
            kwargs["position_ids"] = torch.arange(length, device=x.device).unsqueeze(0)
            return self._run(kwargs)

    def _run(self, kwargs: dict[str, Any]) -> torch.Tensor:
        if self.last:
            return self.top(**kwargs).logits
        base = self.top.get_submodule(self.base_fqn) if self.base_fqn else self.top
        out = base(**kwargs)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def build_stage_modules(model: nn.Module, pipe: Pipeline, pp_rank: int, tp_size: int = 1
                        ) -> list[tuple[int, StageModule]]:
    """``[(stage index, module)]`` for the stages ``pp_rank`` runs, in index order.

    ``model`` is the full model (tp already installed); the stages share its parameters.
    """
    from hpcodegen.placement import Shard

    layer_list, base = _layer_base(pipe)
    units = list(pipe.module_order or ())
    placements = (pipe.boundary.placements if pipe.boundary else None) or {}
    shards = tp_size if placements.get("tp") == Shard(1) else 1
    out = []
    for index in pipe.ranks_stages(pp_rank):
        owned = set(pipe.stages[index].modules)
        top = _cut(model, "", owned, units, layer_list)
        out.append((index, StageModule(top, base, first=index == 0,
                                       last=index == pipe.n_stages - 1, seq_shards=shards)))
    return out


def owned_parameters(model: nn.Module, pipe: Pipeline, pp_rank: int) -> dict[str, Any]:
    """``{FQN: parameter}`` of every parameter a stage of ``pp_rank`` owns (a tied
    parameter once per FQN that names it)."""
    stages = set(pipe.ranks_stages(pp_rank))
    return {fqn: p for fqn, p in model.named_parameters(remove_duplicate=False)
            if pipe.owner(fqn) in stages}


def stage_parameters(modules: Iterable[nn.Module]) -> list[Any]:
    """The distinct parameters of the stage modules (an optimizer's list)."""
    seen: dict[int, Any] = {}
    for module in modules:
        for p in module.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())
