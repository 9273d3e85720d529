"""Install-time re-validation (fallback to the generic engine, with a warning naming the
module) and the synthetic-package loader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rt_artifacts import copy_artifact, record_file
from rt_workers import build_pair

from hpcodegen.errors import PlanError
from hpcodegen.runtime.loader import import_generated_module, package_name

pytestmark = pytest.mark.timeout(400)


def _legacy_cp_meta(meta) -> None:
    """No ``mesh_dim_names`` (legacy: "the full live mesh") and a cp-sharded attention input.

    Frozen over the axes parallel_dims implies (tp only) the attention stays tp_collective;
    on a live (cp, tp) mesh its input changes on cp too, so it is not one tp collective.
    """
    meta["mesh_dim_names"] = None
    for fqn, entry in meta["param_plan"].items():
        if fqn.endswith("self_attn"):
            entry["in_src"]["hidden_states"] = {"cp": "S(1)", "tp": "R"}


def test_tp_collective_contradicted_by_live_mesh_falls_back(tmp_path, fake_world) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.runtime import parallelize_from_generated
    from hpcodegen.runtime.boundaries import RuntimeFallbackWarning
    from hpcodegen.runtime.collectives.matching import TPOps

    art = copy_artifact("llama_tp2", tmp_path / "legacy", _legacy_cp_meta)
    fake_world(4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    _, model = build_pair("llama_tp2")
    with pytest.warns(RuntimeFallbackWarning) as caught:
        parallelize_from_generated(model, mesh, art)
    named = sorted(str(w.message).split(" ")[0] for w in caught)
    assert named == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    attn = model.model.layers[0].self_attn
    assert "forward" in vars(attn) and "_hp_tp" not in vars(attn)
    assert isinstance(vars(model.model.layers[0].mlp)["_hp_tp"], TPOps)
    # the generic forward runs: hidden_states gathered on cp (4 -> 8 tokens), heads local
    x = torch.randn(1, 4, 64)
    cos, sin = torch.ones(1, 8, 16), torch.zeros(1, 8, 16)
    out, _ = attn(x, position_embeddings=(cos, sin), attention_mask=None)
    assert out.shape == (1, 8, 64)


def _modeling(art: Path) -> Path:
    return next(art.glob("modeling_*_gen_npu.py"))


def test_loader_package_siblings_cache_and_isolation(tmp_path) -> None:
    a = copy_artifact("llama_tp2", tmp_path / "one" / "gen")
    b = copy_artifact("llama_tp2", tmp_path / "two" / "gen")
    for art, value in ((a, 1), (b, 2)):
        record_file(art, "sib.py", "sib.py", f"VALUE = {value}\n")
        record_file(art, "modeling", _modeling(art).name,
                    _modeling(art).read_text() + "\nfrom .sib import VALUE as HP_SIB\n")
    path_before = list(sys.path)
    ma, mb = import_generated_module(a), import_generated_module(b)
    assert (ma.HP_SIB, mb.HP_SIB) == (1, 2)
    assert ma.__name__ != mb.__name__
    assert ma.__name__.startswith("hpcodegen_generated.gen_")
    assert import_generated_module(a) is ma
    assert sys.path == path_before
    assert ma.__cached__ is None and not (a / "__pycache__").exists()


def test_unrecorded_sibling_is_refused(tmp_path) -> None:
    art = copy_artifact("llama_tp2", tmp_path / "unrec")
    (art / "sib.py").write_text("VALUE = 1\n")  # present, but not in outputs
    record_file(art, "modeling", _modeling(art).name,
                _modeling(art).read_text() + "\nfrom .sib import VALUE\n")
    with pytest.raises(PlanError) as info:  # verify's rule: unrecorded code is an error
        import_generated_module(art)
    assert "outputs.unrecorded_code" in [f.code for f in info.value.findings]
    from hpcodegen.artifact.load import load_meta
    from hpcodegen.runtime.loader import import_verified_module

    with pytest.raises(PlanError) as info:  # the loader alone refuses it too
        import_verified_module(load_meta(art))
    assert info.value.findings[0].code == "runtime.import_failed"
    assert "not a recorded, hashed output" in str(info.value)


def test_failed_import_is_not_cached(tmp_path) -> None:
    art = copy_artifact("llama_tp2", tmp_path / "broken")
    good = _modeling(art).read_text()
    record_file(art, "modeling", _modeling(art).name, good + "\nraise ValueError('boom')\n")
    with pytest.raises(PlanError) as info:
        import_generated_module(art)
    assert info.value.findings[0].code == "runtime.import_failed"
    assert "boom" in str(info.value)
    assert not any(m.startswith(package_name(art)) for m in sys.modules)
    record_file(art, "modeling", _modeling(art).name, good + "\nOK = True\n")
    assert import_generated_module(art).OK is True


def test_bytes_changed_after_the_check_never_run(tmp_path) -> None:
    """load_verified_meta hashes the files; a write after it is refused by the loader,
    which executes only bytes whose sha256 is the recorded one."""
    from hpcodegen.runtime import import_verified_module, load_verified_meta

    art = copy_artifact("llama_tp2", tmp_path / "race")
    loaded = load_verified_meta(art)
    marker = tmp_path / "ran"
    _modeling(art).write_text(f"open({str(marker)!r}, 'w').close()\n"
                              + _modeling(art).read_text())
    with pytest.raises(PlanError) as info:
        import_verified_module(loaded)
    assert info.value.findings[0].code == "outputs.sha256_drift"
    assert not marker.exists()


def test_modeling_file_count(tmp_path) -> None:
    from hpcodegen.artifact.load import load_meta
    from hpcodegen.runtime.loader import import_verified_module

    art = copy_artifact("llama_tp2", tmp_path / "two")
    (art / "modeling_other_gen_npu.py").write_text("X = 1\n")
    with pytest.raises(PlanError) as info:
        import_verified_module(load_meta(art))
    assert info.value.findings[0].code == "runtime.modeling_file"


def test_plain_transformers_model_is_wrapped_on_instances(tmp_path, fake_world) -> None:
    """A model of the unmodified transformers classes: every boundary wrapped on the instance."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.runtime import parallelize_from_generated

    fake_world(2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    ref, _ = build_pair("llama_tp2")
    art = copy_artifact("llama_tp2", tmp_path / "plain")
    parallelize_from_generated(ref, mesh, art)
    attn = ref.model.layers[0].self_attn
    assert "forward" in vars(attn) and "forward" in vars(ref.lm_head)
    assert "forward" not in vars(ref.model.norm)  # identity boundary: untouched
    assert ref.model.layers[0].self_attn.q_proj.weight.to_local().shape[0] == 32
    ids = torch.randint(0, 256, (2, 8))
    assert ref(input_ids=ids, use_cache=False).logits.shape == (2, 8, 256)
