"""``hpcodegen verify`` on the existing system's real Qwen3-MoE bundles (``module_overrides``).

The bundles (:mod:`bundle_fixtures`) replace norms, attention (a fused ``linear_qkv``) and the
experts, in both naming generations, with ep 2, 4 and 8. Against a config that matches them
field for field they pass every check, each replaced module reported once as info; a config
that differs fails with a finding naming the field. The CLI's entry point runs them in this
process (:mod:`inproc`), several bundles per run; inspect-plan and the torch-free pure verify
run as processes.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import inproc
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import bundle_fixtures as bf  # noqa: E402
import verify_fixtures as vf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = FIXTURES / "configs" / bf.CONFIG_DIR
BUNDLES = [FIXTURES / "artifacts" / name for name in bf.BUNDLES]

pytestmark = pytest.mark.timeout(400)


def verify(*args: str | Path, trust: bool = True) -> tuple[int, dict[str, Any]]:
    """The CLI's JSON verdict; the bundles' injection targets live in ``hyper_parallel``, which
    a user of the existing system trusts explicitly (``--allow-target``, docs/security.md)."""
    allow = [a for p in vf.REFERENCE_TARGETS for a in ("--allow-target", p)] if trust else []
    proc = inproc.run("verify", *args, *allow, "--json", cwd=REPO)  # torch imported once
    return proc.returncode, json.loads(proc.stdout)


def findings(artifact: dict[str, Any], check: str, severity: str | None = None
             ) -> list[dict[str, Any]]:
    return [f for f in artifact["checks"][check]["findings"]
            if severity is None or f["severity"] == severity]


def replaced_fqns(directory: Path) -> list[str]:
    return [r["fqn"] for r in vf.read_meta(directory)["module_overrides"]]


def test_committed_bundles_equal_the_builder(tmp_path: Path) -> None:
    bf.main(tmp_path)
    for path in sorted(tmp_path.rglob("*")):
        if path.is_file():
            rel = path.relative_to(tmp_path)
            assert (FIXTURES / rel).read_bytes() == path.read_bytes(), rel


def test_real_bundles_pass_with_a_matching_config_each_replacement_reported_once() -> None:
    code, doc = verify(*BUNDLES, "--hf-config", CONFIG, "--strict")
    assert code == 0, json.dumps(doc, indent=1)[:4000]
    for directory, artifact in zip(BUNDLES, doc["artifacts"], strict=True):
        assert artifact["ok"] and {c["status"] for c in artifact["checks"].values()} == {"pass"}
        # the derivation's own statements (derive.*) are tested in test_gate_propagation
        model = [f for f in findings(artifact, "model") if not f["code"].startswith("derive.")]
        assert {f["code"] for f in model} == {"model.replaced_module"}
        assert all(f["severity"] == "info" for f in model)
        # exactly once per replaced module, naming it and its replacement
        fqns = replaced_fqns(directory)
        said = Counter(f["message"].split(" is replaced by ")[0] for f in model)
        assert said == Counter(fqns) and max(said.values()) == 1
        assert all("its structure is not checkable here" in f["message"] for f in model)
        gen = bf.BUNDLES[directory.name]["gen"]
        factory = "adapter.conversion.module_replacement" if gen == "g3" \
            else "adapter.replacements"
        assert all(f"{factory}.replace_qwen3_moe_" in f["message"] for f in model)
        assert not findings(artifact, "signature", "warning")


def test_untrusted_bundles_pass_the_gate_with_a_warning_and_never_run() -> None:
    """Without ``--allow-target`` the existing system's own factories are a warning per target
    (the gate still checks everything else and inspect-plan reads the plan); the runtime's
    check refuses them, and the same names in a meta hpcodegen wrote stay errors."""
    from hpcodegen.artifact.load import LoadedMeta
    from hpcodegen.errors import PlanError
    from hpcodegen.targets import check_targets, target_findings

    code, doc = verify(*BUNDLES, "--hf-config", CONFIG, trust=False)
    assert code == 0, json.dumps(doc, indent=1)[:4000]
    for directory, artifact in zip(BUNDLES, doc["artifacts"], strict=True):
        assert not [f for f in findings(artifact, "plan") if f["severity"] != "info"]
        gate = [f for f in findings(artifact, "targets") if f["severity"] != "info"]
        assert gate and {(f["code"], f["severity"]) for f in gate} == {
            ("plan.foreign_system_target", "warning")}
        meta = vf.read_meta(directory)

        def loaded(data: dict, where: Path = Path(directory)) -> LoadedMeta:
            return LoadedMeta(data, where / "codegen_meta.json", where)

        assert len(gate) == len(target_findings(loaded(meta)))
        with pytest.raises(PlanError, match="not in the injection registry"):
            check_targets(loaded(meta))
        # trusted: resolvable, nothing imported
        check_targets(loaded(meta), vf.REFERENCE_TARGETS)
        ours = dict(meta, generator={"name": "hpcodegen", "version": "0"})
        assert {f.severity.value for f in target_findings(loaded(ours))} == {"error"}
        evil = copy.deepcopy(meta)
        evil["injections"][0]["local_compute_fn"] = {"_target_": "os.system"}
        assert "error" in {f.severity.value for f in target_findings(loaded(evil))}
    code, doc = verify(BUNDLES[0], "--strict", trust=False)
    assert code == 1  # --strict: a target nobody trusted is not a clean pass
    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "inspect-plan", str(BUNDLES[0])],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = "".join((proc.stdout + proc.stderr).split())
    assert "isafactoryofthesystemthatwrotethismeta(hyper_parallel)" in said


def test_mismatching_configs_fail_naming_the_field(tmp_path: Path) -> None:
    experts = vf.write_config(tmp_path / "experts", dict(bf.TINY_CONFIG, num_local_experts=16))
    layers = vf.write_config(tmp_path / "layers", dict(bf.TINY_CONFIG, num_hidden_layers=2))
    art = BUNDLES[0]
    code, doc = verify(art, "--hf-config", experts)
    assert code == 1
    (artifact,) = doc["artifacts"]
    errors = {f["path"]: f["message"] for f in findings(artifact, "signature", "error")}
    assert errors == {
        "/source/structure/num_experts":
            "num_experts (the config's num_local_experts): artifact 8, config 16",
        "/source/structure/num_local_experts": "num_local_experts: artifact 8, config 16",
    }
    code, doc = verify(art, "--hf-config", layers)
    assert code == 1
    (artifact,) = doc["artifacts"]
    sig = findings(artifact, "signature", "error")
    assert [(f["path"], f["message"]) for f in sig] == [
        ("/source/structure/num_hidden_layers", "num_hidden_layers: artifact 4, config 2")]
    model = findings(artifact, "model", "error")
    assert {f["code"] for f in model} == {"model.override_unknown_module", "model.unknown_module"}
    assert any("'model.layers.3.self_attn', which is not a module" in f["message"]
               for f in model)


def test_pure_verify_of_a_bundle_never_imports_torch() -> None:
    probe = ("import sys; from hpcodegen.verify import run_verify; import io;"
             f"c = run_verify({[str(b) for b in BUNDLES]!r}, stdout=io.StringIO(), "
             f"allow_target={vf.REFERENCE_TARGETS!r});"
             "print(c, 'torch' in sys.modules, 'transformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.stdout.split() == ["0", "False", "False"], proc.stderr


# ------------------------------------------------------------------ the model check in-process

def model(meta: dict[str, Any], config: dict[str, Any]) -> Any:
    return vf.run_check("model", meta, hf_config=config)


def test_override_of_the_wrong_type_is_an_error() -> None:
    meta = bf.bundle_meta()
    record = meta["module_overrides"][9]
    assert record["fqn"] == "model.layers.0.self_attn"
    record["module_type"] = "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeMLP"
    result = model(meta, dict(bf.TINY_CONFIG))
    assert result.status == "fail"
    (f,) = [f for f in result.findings if f.severity.value == "error"]
    assert (f.code, f.where) == ("model.override_type_mismatch", "/module_overrides/9/module_type")
    assert f.message == ("model.layers.0.self_attn is a Qwen3MoeAttention, the override "
                         "replaces transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeMLP")


def test_exact_type_and_moved_class_paths() -> None:
    meta = bf.bundle_meta()
    for record in meta["module_overrides"]:
        # another transformers release may move the class: the name decides
        record["module_type"] = record["module_type"].replace("modeling_qwen3_moe", "modular")
        record["exact_type"] = True
    assert model(meta, dict(bf.TINY_CONFIG)).status == "pass"
    meta["module_overrides"][0]["module_type"] = "torch.nn.Module"  # a base class, not exact
    assert {f.code for f in model(meta, dict(bf.TINY_CONFIG)).findings
            if f.severity.value == "error"} == {"model.override_type_mismatch"}
    meta["module_overrides"][0]["exact_type"] = False
    assert model(meta, dict(bf.TINY_CONFIG)).status == "pass"


def test_grouped_and_glob_only_records_select_the_same_modules() -> None:
    """G1 groups FQNs under one record (``fqns`` only); with neither, ``match`` globs select
    the modules of ``module_type``."""
    meta = bf.bundle_meta()
    expected = Counter(r["fqn"] for r in meta["module_overrides"])
    by_factory: dict[str, dict[str, Any]] = {}
    for r in meta["module_overrides"]:
        group = by_factory.setdefault(r["factory"], {k: copy.deepcopy(v) for k, v in r.items()
                                                     if k not in ("fqn", "fqns", "match")})
        group.setdefault("fqns", []).append(r["fqn"])
    globs = copy.deepcopy(meta)
    meta["module_overrides"] = list(by_factory.values())
    for r in globs["module_overrides"]:
        del r["fqn"], r["fqns"]
    for variant in (meta, globs):
        result = model(variant, dict(bf.TINY_CONFIG))
        assert result.status == "pass", [f.message for f in result.findings]
        said = Counter(f.message.split(" is replaced")[0] for f in result.findings
                       if not f.code.startswith("derive."))
        assert said == expected


def test_unreplaced_experts_are_checked_against_the_ep_size() -> None:
    meta = bf.bundle_meta(ep=8)
    meta["module_overrides"] = [r for r in meta["module_overrides"]
                                if "experts" not in r["fqn"]]
    assert model(meta, dict(bf.TINY_CONFIG)).status == "pass"
    result = model(meta, dict(bf.TINY_CONFIG, num_local_experts=12))
    errors = [f for f in result.findings if f.severity.value == "error"]
    assert [(f.code, f.where) for f in errors] == [
        ("model.experts_not_divisible", "/parallel_dims/ep_size")]
    assert errors[0].message == "num_local_experts = 12 experts do not divide over ep_size = 8"


def test_a_source_outside_transformers_is_not_built() -> None:
    meta = bf.bundle_meta()
    meta["source"]["module_name"] = "hyper_parallel.models.deepseek_v41.modeling_deepseek_v41"
    result = model(meta, dict(bf.TINY_CONFIG))
    assert result.status == "skipped"
    assert "hyper_parallel.models.deepseek_v41.modeling_deepseek_v41 is not a transformers " \
           "module" in result.reason


def test_structure_aliases_in_either_direction() -> None:
    meta = bf.bundle_meta()
    config = dict(bf.TINY_CONFIG)
    config["num_experts"] = config.pop("num_local_experts")
    result = vf.run_check("signature", meta, hf_config=config)
    assert result.status == "pass" and not [f for f in result.findings
                                            if f.severity.value != "info"]
    del config["num_experts"]
    result = vf.run_check("signature", meta, hf_config=config)
    assert {f.code for f in result.findings if f.severity.value == "warning"} == {
        "signature.structure_unset"}


def test_full_size_qwen3_30b_a3b_bundle_verifies(tmp_path: Path) -> None:
    config = dict(bf.QWEN3_30B_A3B_CONFIG)
    art = bf.build_bundle("qwen3_moe_bundle_g3", tmp_path / "art", config=config)
    cfg = vf.write_config(tmp_path / "cfg", config)
    code, doc = verify(art, "--hf-config", cfg, "--strict")
    assert code == 0, json.dumps(doc, indent=1)[:3000]
    model = [f for f in findings(doc["artifacts"][0], "model")
             if not f["code"].startswith("derive.")]
    assert len(model) == len(replaced_fqns(art)) == 48 * 4 + 1


# ------------------------------------------- what the replacement keeps, read from its class

Q_NORM = "model.layers.0.self_attn.q_norm"
ATTN = "model.layers.0.self_attn"


def _bundle(tmp_path: Path, mutate: Any = None) -> Path:
    art = bf.build_bundle("qwen3_moe_bundle_g3", tmp_path / "art")
    if mutate is not None:
        meta = vf.read_meta(art)
        mutate(meta)
        vf.save_meta(art, meta, resign=False, refreeze=True)
    return art


def _errors(art: Path) -> list[tuple[str, str, str]]:
    result = vf.run_check("model", art, hf_config=dict(bf.TINY_CONFIG))
    return [(f.code, f.where, f.message) for f in result.findings if f.severity.value == "error"]


def test_children_the_replacement_keeps_are_checked_against_the_original(tmp_path: Path) -> None:
    """GQAAttention keeps ``o_proj``, ``q_norm`` and ``k_norm`` of the module it replaces
    (``self.o_proj = module.o_proj`` in the modeling file): the plan below them must fit the
    original, while ``linear_qkv`` is the replacement's own."""
    assert _errors(_bundle(tmp_path / "ok")) == []

    def wrong_class(meta: dict[str, Any]) -> None:
        meta["boundary_classes"][Q_NORM] = "Qwen3MoeLayerNorm"

    def wrong_param(meta: dict[str, Any]) -> None:
        params = meta["param_plan"][ATTN]["params"]
        params["o_proj.wieght"] = params.pop("o_proj.weight")

    def uncovered(meta: dict[str, Any]) -> None:
        del meta["param_plan"][Q_NORM], meta["boundary_classes"][Q_NORM]

    assert _errors(_bundle(tmp_path / "a", wrong_class)) == [
        ("model.class_mismatch", f"/boundary_classes/{Q_NORM}",
         f"{Q_NORM} is a Qwen3MoeRMSNorm, the plan says Qwen3MoeLayerNorm")]
    assert _errors(_bundle(tmp_path / "b", wrong_param)) == [
        ("model.missing_param", f"/param_plan/{ATTN}/params/o_proj.wieght",
         f"planned parameter {ATTN}.o_proj.wieght is missing from the model"),
        ("model.uncovered_param", f"{ATTN}.o_proj.weight",
         f"trainable parameter {ATTN}.o_proj.weight is not covered by the frozen plan")]
    assert _errors(_bundle(tmp_path / "c", uncovered)) == [
        ("model.uncovered_param", f"{Q_NORM}.weight",
         f"trainable parameter {Q_NORM}.weight is not covered by the frozen plan")]


def test_a_replacement_class_outside_the_file_leaves_its_children_unchecked(
        tmp_path: Path) -> None:
    art = _bundle(tmp_path)
    meta = vf.read_meta(art)
    meta["boundary_classes"][ATTN] = "ImportedAttention"  # not defined in the modeling file
    meta["boundary_classes"][Q_NORM] = "Qwen3MoeLayerNorm"
    vf.save_meta(art, meta, resign=False)
    result = vf.run_check("model", art, hf_config=dict(bf.TINY_CONFIG))
    assert result.status == "pass"
    (f,) = [f for f in result.findings if f.message.startswith(f"{ATTN} is replaced")]
    assert "10 planned name(s) describe the replacement" in f.message


def test_a_kept_child_under_another_name_maps_to_the_original(tmp_path: Path) -> None:
    """``self.out = module.o_proj``: the plan's ``out.weight`` is the original's
    ``o_proj.weight`` (checked there, and it covers it)."""
    art = _bundle(tmp_path)
    name = vf.modeling_name(art)
    source = (art / name).read_text().replace("self.o_proj = module.o_proj",
                                              "self.out = module.o_proj")
    vf.rewrite_file(art, name, source)
    meta = vf.read_meta(art)
    for i in range(bf.TINY_CONFIG["num_hidden_layers"]):
        params = meta["param_plan"][f"model.layers.{i}.self_attn"]["params"]
        params["out.weight"] = params.pop("o_proj.weight")
    vf.save_meta(art, meta, resign=False, refreeze=True)
    assert _errors(art) == []
    params = meta["param_plan"][ATTN]["params"]
    params["out.weight"] = {"cp": "R", "ep": "R", "tp": "S(2)"}
    vf.save_meta(art, meta, resign=False, refreeze=True)
    assert _errors(art) == [("model.shard_dim_out_of_range", f"/param_plan/{ATTN}/params/"
                             "out.weight/tp", f"{ATTN}.out.weight: S(2) needs dim < 2 "
                             "(2-D tensor (256, 256))")]


def test_plan_check_flags_override_records_that_select_nothing_or_twice() -> None:
    meta = bf.bundle_meta()
    assert vf.codes(vf.run_check("plan", meta), "warning") == set()
    meta["module_overrides"].append(dict(meta["module_overrides"][0]))
    meta["module_overrides"].append({"factory": "pkg.make", "module_type": "torch.nn.Linear"})
    n = len(meta["module_overrides"])
    assert vf.codes(vf.run_check("plan", meta), "warning") == {
        ("plan.override_duplicate", f"/module_overrides/{n - 2}"),
        ("plan.override_selects_nothing", f"/module_overrides/{n - 1}")}


def test_ep_stack_targets_are_made_from_their_sources() -> None:
    """``ep_stack`` stacks per-expert parameters into one ``[E, ...]`` parameter: the stacked
    name is not a parameter of the HF model, its sources are, all of one shape, and they are
    covered by it."""
    layer = "model.layers.0"
    meta = vf.qwen3_moe_meta("g3")
    norms = ["input_layernorm.weight", "post_attention_layernorm.weight"]
    meta["injections"].append({"match": [layer], "ep_stack": {"norms": list(norms)}})
    meta["param_plan"][layer] = {"params": {"norms": {"cp": "R", "ep": "S(0)"}},
                                 "is_boundary": False}
    for rel in norms:
        del meta["param_plan"][f"{layer}.{rel.split('.')[0]}"]
    config = dict(vf.QWEN3_MOE_CONFIG)
    result = model(meta, config)
    assert result.status == "pass", [f.message for f in result.findings]
    meta["injections"][-1]["ep_stack"]["norms"] = [norms[0], "self_attn.q_proj.weight", "nope"]
    errors = {(f.code, f.where) for f in model(meta, config).findings
              if f.severity.value == "error"}
    where = f"/injections/{len(meta['injections']) - 1}/ep_stack/norms"
    assert errors == {("model.ep_stack_source_missing", f"{where}/2"),
                      ("model.ep_stack_shapes_differ", where),
                      ("model.uncovered_param", f"{layer}.post_attention_layernorm.weight")}
