"""Rank workers of tests/runtime/test_compile_dtensor.py: a parallelized model compiled by
``compile_parallelized`` trained as a user would (forward, backward, torch's clip, AdamW, a
DCP round trip), each answer measured against the unsharded eager model."""

from __future__ import annotations

from typing import Any

from dtensor_workers import MAX_NORM, _grads_diff, _max_diff, _params_diff, dcp_round_trip
from rt_workers import EPS, LR, _pair, batch, loss_of


def _counting_backend(dtensor_inputs: list[int]) -> Any:
    """aot_eager (AOTAutograd, no codegen), recording how many of each graph's inputs are
    DTensors."""
    import torch
    from torch.distributed.tensor import DTensor

    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm: Any, inputs: list[Any]) -> Any:
        dtensor_inputs.append(sum(isinstance(x, DTensor) for x in inputs))
        return aot_eager(gm, inputs)
    return backend


def guarded_dtensor_lines(trees: list[str]) -> list[str]:
    """The lines of dynamo's guard trees that guard a DTensor or a view hook's object
    (what ``views_outside`` keeps out of every compiled frame's guards)."""
    return [line.strip() for tree in trees for line in tree.splitlines()
            if "DTensor" in line or "_hp_local_view" in line]


def one_decoder_layer(*models: Any) -> None:
    """Keep the first decoder layer of each model (after the artifact parallelized them: its
    plan names every layer's parameters). Every layer runs the same code with the same
    boundaries, so one carries each kind the plan has; what dynamo traces and AOTAutograd
    partitions (scope ``model``) grows with the depth."""
    for model in models:
        del model.model.layers[1:]


def compiled_tools(artifact: str, scope: str, checkpoint_dir: str) -> dict[str, Any]:
    """Two compiled training steps on a 1-D tp mesh against the unsharded eager model; the
    guard trees dynamo builds meanwhile, read for DTensor guards."""
    import torch
    import torch._dynamo.guards as dynamo_guards
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from hpcodegen.parity.gather import full_logits
    from hpcodegen.parity.harness import install
    from hpcodegen.runtime.compile import compile_parallelized

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    pair = _pair(artifact)
    installed = install(pair, mesh)
    gen, ref, plan = pair.sharded, pair.reference, pair.plan
    one_decoder_layer(gen, ref)
    dtensor_inputs: list[int] = []
    compile_parallelized(gen, scope, backend=_counting_backend(dtensor_inputs))
    ids, labels = batch(ref.config.vocab_size)

    def logits_of(model: Any) -> Any:
        return full_logits(model(input_ids=ids, use_cache=False).logits, model, plan,
                           installed.active)

    out: dict[str, Any] = {"logits": [], "grad": [], "norm": [], "step": []}
    trees: list[str] = []
    # dynamo's own hook for tests: called with each new guard manager (this rank's process
    # is kept for the session: the hook is removed below)
    dynamo_guards.guard_manager_testing_hook_fn = lambda gm, _scope, _b: trees.append(str(gm))
    try:
        _steps(gen, ref, logits_of, ids, labels, out)
    finally:
        dynamo_guards.guard_manager_testing_hook_fn = None
    out["guard_trees"] = len(trees)
    out["guarded"] = guarded_dtensor_lines(trees)[:5]
    out["grads_dtensor"] = all(isinstance(p.grad, DTensor) for p in gen.parameters())
    out["params_dtensor"] = all(isinstance(p, DTensor) for p in gen.parameters())
    with torch.no_grad():
        after = logits_of(gen)
    out["restored"] = dcp_round_trip(gen, checkpoint_dir, logits_of, after)
    out["dtensor_inputs"] = dtensor_inputs
    return out


def _steps(gen: Any, ref: Any, logits_of: Any, ids: Any, labels: Any,
           out: dict[str, Any]) -> None:
    """Two AdamW steps of both models, each step's differences appended to ``out``."""
    import torch
    from torch.distributed.tensor import DTensor

    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS)
    opt = torch.optim.AdamW(gen.parameters(), lr=LR, eps=EPS)
    for _ in range(2):  # the second step: the optimizer's update is what the graph reads
        opt_ref.zero_grad()
        opt.zero_grad()
        ref_logits = ref(input_ids=ids, use_cache=False).logits
        logits = logits_of(gen)
        loss_of(ref_logits, labels).backward()
        loss_of(logits, labels).backward()
        out["logits"].append(_max_diff(logits, ref_logits))
        out["grad"].append(_grads_diff(gen, ref))  # full_tensor(): each .grad a DTensor
        norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
        norm = torch.nn.utils.clip_grad_norm_(gen.parameters(), MAX_NORM)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        out["norm"].append((float(norm), float(norm_ref)))
        opt_ref.step()
        opt.step()
        out["step"].append(_params_diff(gen, ref))
