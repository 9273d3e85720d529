"""The parity harness: is the parallelized model the unsharded model's function?

"Correct means measured against the unsharded model": every runtime check, ``launch
--check-parity``, the tests and ``bench/coverage.py`` run this one procedure:

1. :func:`build_pair`: the unsharded transformers model (the reference) and the model of
   the artifact's generated classes, the same weights in both; the artifact is read and
   checked once (:meth:`hpcodegen.Artifact.load`);
2. :func:`install`: the plan of that same checked artifact installed on the second over a
   live mesh (checked against the config first), with the active and expert meshes it
   resolved;
3. :func:`compare`: one forward and backward of both on the same batch; the logits
   (gathered per the LM head's placement) and every parameter's gradient (gathered per the
   plan's placement, :mod:`hpcodegen.parity.gather`) against the reference's;
4. :func:`count_collectives` / :func:`predicted_collectives`: the collectives a forward or
   backward ran, by kind, against what inspect-plan predicts for the artifact.

A loss-parallel head's logits stay vocab-sharded for the loss (the runtime's
``vocab_parallel_cross_entropy``, what a user's training runs) and are gathered for the
comparison only. Callers keep their own batches and tolerances; the harness compares and
returns the distances.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcodegen.parity.gather import max_param_diff
from hpcodegen.parity.step import forward_loss, loss_of_logits, sync_gradients, whole_logits
from hpcodegen.plan.types import Plan


@dataclass
class Pair:
    """The reference and the model to parallelize, built with the same weights."""

    reference: Any
    sharded: Any
    plan: Plan
    artifact: Path
    config_dict: dict[str, Any]
    #: the checked :class:`hpcodegen.Artifact` (read once: the class and the install use it)
    art: Any = None


@dataclass
class Installed:
    """What :func:`install` resolved: the runtime's ``source_info`` and the live meshes."""

    info: dict[str, Any]
    active: Any
    expert: Any = None


@dataclass
class ParityResult:
    """Distances of one forward/backward: max abs diffs and where the worst gradient is."""

    logits: float
    grad: float
    worst: str | None
    odd: list[str] = field(default_factory=list)
    loss: float = 0.0
    ref_loss: float = 0.0
    grad_scale: float = 0.0
    #: the full logits compared (sharded model's gathered, the reference's), detached
    sharded_logits: Any = field(default=None, repr=False)
    ref_logits: Any = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"logits": self.logits, "grad": self.grad, "worst": self.worst,
                "odd": list(self.odd), "loss": self.loss, "ref_loss": self.ref_loss,
                "grad_scale": self.grad_scale}


def read_config(config_dir: str | Path) -> dict[str, Any]:
    """The ``config.json`` dict of a model dir."""
    return json.loads(Path(config_dir, "config.json").read_text())


def build_pair(artifact: str | Path, config_dict: Mapping[str, Any], *, dtype: Any = None,
               seed: int = 0, eval_mode: bool = True, attn_implementation: str | None = None,
               prepare: Callable[[Any], None] | None = None, plain: bool = False) -> Pair:
    """The unsharded model and the generated one (``plain``: the transformers class again,
    boundaries then wrapped per instance), the reference's weights loaded into both.

    ``prepare(reference)`` runs under ``no_grad`` before the weights are copied (random
    gates, non-zero biases: what a check needs to see a mistake).
    """
    import torch

    from hpcodegen.hf import load_transformers_config, model_class_for
    from hpcodegen.runtime.artifact import Artifact

    artifact = Path(artifact)
    dtype = dtype or torch.float32
    config = load_transformers_config(dict(config_dict))
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    ref = model_class_for(dict(config_dict))(config).to(dtype)
    if prepare is not None:
        with torch.no_grad():
            prepare(ref)
    art = Artifact.load(artifact)
    cls = type(ref) if plain else art.model_class()
    gen = cls(config).to(dtype)
    gen.load_state_dict(ref.state_dict())
    if eval_mode:
        ref.eval()
        gen.eval()
    return Pair(ref, gen, art.plan, artifact, dict(config_dict), art)


def install(pair: Pair, mesh: Any) -> Installed:
    """The plan installed on ``pair.sharded`` over ``mesh`` (a ``DeviceMesh`` or a
    ``MeshContext``); the active mesh and, for an expert plan, the expert mesh."""
    from hpcodegen.runtime import MeshContext
    from hpcodegen.runtime.artifact import Artifact
    from hpcodegen.runtime.experts import resolve_expert_mesh
    from hpcodegen.runtime.mesh import resolve_active_mesh

    context = mesh if isinstance(mesh, MeshContext) else MeshContext(device_mesh=mesh)
    art = pair.art if pair.art is not None else Artifact.load(pair.artifact)
    info = art.with_config(pair.config_dict).install(pair.sharded, context)
    return Installed(info, resolve_active_mesh(pair.plan, context),
                     resolve_expert_mesh(pair.plan, context.device_mesh))


def token_batch(vocab: int, rows: int, length: int, seed: int = 1,
                generator: Any = None) -> tuple[Any, Any]:
    """Seeded token ids and their next-token labels, ``(rows, length)`` each (the same on
    every rank); drawn from ``generator`` when given (further inputs then follow)."""
    import torch

    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def loss_and_logits(model: Any, inputs: Mapping[str, Any], labels: Any, plan: Plan,
                    active: Any | None, vocab: int | None = None) -> tuple[Any, Any]:
    """Cross entropy of ``model(**inputs)`` and the logits it was taken on (the loss rule,
    :mod:`hpcodegen.parity.step`, without cp)."""
    return loss_of_logits(model(**inputs).logits, labels, model, plan, active, vocab)


def compare(sharded: Any, reference: Any, plan: Plan, installed: Installed,
            inputs: Mapping[str, Any], labels: Any, vocab: int | None = None,
            zero_grad: bool = False) -> ParityResult:
    """One forward/backward of both models on the full batch ``inputs``; logits and every
    gradient.

    ``labels`` are aligned per position (``-100``: no loss). Under context parallelism the
    sharded model takes this rank's positions and its gradients are summed over cp
    (:mod:`hpcodegen.parity.step`); its logits are compared in the batch's order. Where
    ``inputs`` has an ``attention_mask``, logits are compared at its tokens only (a padded
    position's logits mean nothing). The gradients stay on the parameters (a caller may
    compare more, e.g. clipping) unless ``zero_grad``.
    """
    active, expert = installed.active, installed.expert
    fwd = forward_loss(sharded, inputs, labels, plan, active, vocab)
    fwd.loss.backward()
    sync_gradients(sharded, active)
    logits = whole_logits(fwd, sharded, plan, active)
    ref = forward_loss(reference, inputs, labels, plan, None)
    ref.loss.backward()
    ref_logits = ref.logits.detach()
    grad, worst, odd = max_param_diff(sharded, reference, plan, active, lambda p: p.grad,
                                      expert)
    result = ParityResult(_logits_diff(logits, ref_logits, inputs.get("attention_mask")),
                          grad, worst, odd, float(fwd.value), float(ref.value),
                          _grad_scale(reference), logits, ref_logits)
    if zero_grad:
        sharded.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    return result


def _logits_diff(logits: Any, ref_logits: Any, mask: Any) -> float:
    """Max abs difference (NaN if the shapes differ), at the mask's tokens when given."""
    if logits.shape != ref_logits.shape:
        return float("nan")
    diff = (logits - ref_logits).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    return float(diff.max()) if diff.numel() else 0.0


def _grad_scale(model: Any) -> float:
    """The largest gradient entry of ``model`` (one device sync): a tolerance below it
    tests something."""
    import torch

    from hpcodegen.runtime.shards import local_grad

    grads = [local_grad(p) for p in model.parameters()]  # this rank's values
    peaks = [g.detach().abs().max().double() for g in grads if g is not None and g.numel()]
    return float(torch.stack(peaks).max()) if peaks else 0.0


#: CommDebugMode's op names -> inspect-plan's collective kinds
OP_KIND = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
           "all_reduce": "all_reduce", "allreduce_": "all_reduce",
           "_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter"}


@contextmanager
def count_collectives() -> Iterator[Counter]:
    """``with count_collectives() as seen:`` the collectives run inside, by kind."""
    from torch.distributed.tensor.debug import CommDebugMode

    seen: Counter = Counter()
    with CommDebugMode() as mode:
        yield seen
    for op, n in mode.get_comm_counts().items():
        name = str(op).split(".")[-1].split("'")[0]
        seen[OP_KIND.get(name, name)] += n


def predicted_collectives(plan: Plan) -> tuple[Counter, Counter]:
    """inspect-plan's collectives per forward and per backward (the partial gradients'
    all-reduces, ``Summary.grad_sync``, included in the backward), by kind."""
    from hpcodegen.plan.predict import predict_plan, summarize

    summary = summarize(predict_plan(plan))
    fwd, bwd = Counter(), Counter()
    for (kind, _axis, _dim), n in summary.per_forward.items():
        fwd[kind] += n
    for (kind, _axis, _dim), n in summary.per_backward.items():
        bwd[kind] += n
    for (kind, _axis, _dim), n in summary.grad_sync.items():
        bwd[kind] += n
    return +fwd, +bwd
