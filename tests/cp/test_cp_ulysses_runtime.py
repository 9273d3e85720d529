"""Ulysses and the hybrid on torch's fake process group (one process, no numerics): the
collectives CommDebugMode counts equal inspect-plan's prediction, forward and backward,
all_to_alls on cp included; the kernel gets a head shard of the group's whole sequence
(kv heads replicated where fewer than the ranks); refusals name the heads."""

from __future__ import annotations

import pytest
from cp_paths import CONFIGS
from test_cp_runtime import _counted, _model, _predicted

from hpcodegen.errors import PlanError

pytestmark = [pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning"),
              pytest.mark.filterwarnings("ignore:For backward hooks:UserWarning")]


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("config", "tp", "cp", "sp", "method", "ulysses"), [
    ("llama_gqa", 1, 2, False, "ulysses", None),
    ("llama_gqa", 2, 2, True, "ulysses", None),
    ("mistral_swa", 1, 4, False, "hybrid", 2),
])
def test_counts_match_prediction(config, tp, cp, sp, method, ulysses, cp_artifact,
                                 fake_world) -> None:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.runtime.cp import shard_batch

    artifact = cp_artifact(config, tp=tp, cp=cp, sp=sp, method=method, ulysses=ulysses)
    fake_world(cp * tp)
    _, model, _ = _model(artifact, CONFIGS / config, cp, tp)
    batch = shard_batch(model, torch.randint(0, 256, (2, 32)))
    with CommDebugMode() as fwd_mode:
        logits = model(**batch.inputs).logits
    with CommDebugMode() as bwd_mode:
        logits.float().sum().backward()
    want_fwd, want_bwd, by_axis = _predicted(load_meta(artifact).data)
    assert _counted(fwd_mode) == want_fwd
    assert _counted(bwd_mode) == want_bwd
    layers = model.config.num_hidden_layers
    # per attention layer: Q, K, V traded for heads and the output traded back, both ways
    assert by_axis[("forward", "all_to_all", "cp")] == 4 * layers
    assert by_axis[("backward", "all_to_all", "cp")] == 4 * layers
    gathers = 2 * layers if method == "hybrid" else 0  # K/V across the Ulysses groups
    assert by_axis[("forward", "all_gather", "cp")] == gathers + 1  # + the batch's ids
    assert by_axis[("backward", "reduce_scatter", "cp")] == gathers


@pytest.mark.timeout(400)
def test_the_kernel_sees_a_head_shard_of_the_whole_sequence(cp_artifact, fake_world) -> None:
    """Llama GQA, 8 query / 2 kv heads at tp 2 x cp 2: each rank's kernel gets 2 query heads
    and its copy of the 1 kv head they use, for all 32 positions; mask rows [B, 1, 32, 32];
    the module's view says 2 query heads per kv head (not the model's 4)."""
    import torch

    from hpcodegen.runtime.cp import shard_batch

    fake_world(4)
    artifact = cp_artifact("llama_gqa", tp=2, cp=2, method="ulysses")
    _, model, _ = _model(artifact, CONFIGS / "llama_gqa", 2, 2)
    seen = []
    for layer in model.model.layers:
        cp_attention = layer.self_attn._hp_cp_attention
        kernel = cp_attention.kernel

        def record(module, query, key, value, mask, kernel=kernel, **kwargs):
            seen.append((tuple(query.shape), tuple(key.shape), tuple(mask.shape),
                         module.num_key_value_groups))
            return kernel(module, query, key, value, mask, **kwargs)
        cp_attention.kernel = record
    batch = shard_batch(model, torch.randint(0, 256, (2, 32)))
    out = model(**batch.inputs).logits
    assert out.shape[:2] == (2, 16)
    assert seen == [((2, 2, 32, 8), (2, 1, 32, 8), (2, 1, 32, 32), 2)] * 2


@pytest.mark.timeout(400)
def test_a_method_other_than_the_mesh_runs_is_refused(cp_artifact, fake_world) -> None:
    from hpcodegen.runtime.cp.wrappers import sdpa_hf, sdpa_hf_hybrid

    fake_world(2)
    _, model, _ = _model(cp_artifact("llama_gqa", tp=1, cp=2, method="ulysses"),
                         CONFIGS / "llama_gqa", 2, 1)
    attention = model.model.layers[0].self_attn
    with pytest.raises(PlanError, match="one method"):
        sdpa_hf(attention, causal=True)
    with pytest.raises(PlanError, match="one method"):
        sdpa_hf_hybrid(attention, causal=True, ulysses_degree=2)


def test_runtime_refuses_heads_that_cannot_be_grouped() -> None:
    import torch

    from hpcodegen.runtime.collectives.comm import Comm
    from hpcodegen.runtime.cp.ulysses import UlyssesExchange

    exchange = UlyssesExchange(Comm(None), 4, 0)
    q, kv = torch.zeros(1, 6, 4, 2), torch.zeros(1, 3, 4, 2)
    with pytest.raises(PlanError, match="6 query heads") as info:
        exchange.to_heads(torch.nn.Identity(), q, kv, kv)
    assert info.value.findings[0].code == "runtime.cp_ulysses_heads"


@pytest.mark.timeout(400)
def test_the_existing_systems_ulysses_meta_runs_with_ours(cp_artifact, fake_world,
                                                          tmp_path) -> None:
    """A meta as the existing system writes it: ``sdpa_qkv_ulysses`` and no declared
    transitions, no ``cp_layout`` (contiguous): the name implies the exchange, which runs
    and is counted as predicted."""
    import json
    import shutil

    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.artifact.digest import meta_signature
    from hpcodegen.runtime.cp import shard_batch

    source = cp_artifact("llama_gqa", tp=1, cp=2, method="ulysses", layout="contiguous")
    artifact = tmp_path / "foreign"
    shutil.copytree(source, artifact)
    meta_path = artifact / "codegen_meta.json"
    meta = json.loads(meta_path.read_text())
    meta["parallel_dims"].pop("cp_layout")
    for record in meta["injections"]:
        if "inner_in_src" in record:
            for key in ("inner_in_src", "inner_in_dst", "inner_out_src", "inner_out_dst",
                        "cp_heads"):
                record.pop(key)
            record["inner_wrapper"] = {"_target_": "sdpa_qkv_ulysses", "causal": True}
    meta["signature"] = meta_signature(meta)
    meta_path.write_text(json.dumps(meta))
    fake_world(2)
    _, model, _ = _model(artifact, CONFIGS / "llama_gqa", 2, 1)
    assert model.model.layers[0].self_attn._hp_cp_attention.ulysses is not None
    batch = shard_batch(model, torch.randint(0, 256, (2, 32)))
    with CommDebugMode() as fwd_mode:
        logits = model(**batch.inputs).logits
    with CommDebugMode() as bwd_mode:
        logits.float().sum().backward()
    want_fwd, want_bwd, _ = _predicted(meta)
    assert _counted(fwd_mode) == want_fwd
    assert _counted(bwd_mode) == want_bwd
    assert want_fwd["all_to_all"] == 4 * model.config.num_hidden_layers
