"""The bad-input corpus: each case breaks one rule of a good artifact and pins the exit code,
the check that fails and the exact JSON pointer (or FQN / file) it reports.

Every case runs twice: alone through ``run_verify`` (its own exit code) and, batched, through
one ``hpcodegen verify ... --hf-config --json`` run of the console script's entry point in this
process (:mod:`inproc`: the real Click parsing, envelope and exit code) whose per-artifact JSON
must say the same; that run must never print a traceback.

The solo run passes ``hf_config`` only to the cases about a config check (``signature``,
``model``): for the others the batch already gives each case's exit code and finding with the
config, so deriving the model a second time per case (about 0.17 CPU-s each, half the module's
time) would assert nothing new; their solo run checks the exit code without the config checks.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import inproc
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

from hpcodegen.verify import CONFIG_CHECKS, run_verify  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = FIXTURES / "configs" / "llama"
Mutate = Callable[[Path], "Path | None"]


@dataclass(frozen=True)
class Case:
    id: str
    mutate: Mutate
    exit: int
    check: str
    code: str
    #: the reported location; a callable gets the verified path
    where: str | Callable[[Path], str]


def meta_edit(fn: Callable[[dict[str, Any]], None], *, resign: bool = True,
              refreeze: bool = False) -> Mutate:
    def mutate(d: Path) -> None:
        meta = vf.read_meta(d)
        fn(meta)
        vf.save_meta(d, meta, resign=resign, refreeze=refreeze)
    return mutate


def raw_meta(data: bytes) -> Mutate:
    def mutate(d: Path) -> None:
        (d / "codegen_meta.json").write_bytes(data)
    return mutate


def source_edit(fn: Callable[[str], str]) -> Mutate:
    def mutate(d: Path) -> None:
        name = vf.modeling_name(d)
        vf.rewrite_file(d, name, fn((d / name).read_text()))
    return mutate


def plan_set(fqn: str, *keys_value: Any) -> Callable[[dict[str, Any]], None]:
    """``meta.param_plan[fqn][k1][k2]... = value``."""
    *keys, value = keys_value

    def fn(meta: dict[str, Any]) -> None:
        node = meta["param_plan"][fqn]
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return fn


def _dup_key(d: Path) -> None:
    text = (d / "codegen_meta.json").read_text()
    text = text.replace('"lm_head": {', '"lm_head": {\n      "params": {},', 1)
    (d / "codegen_meta.json").write_text(text)


def _missing(d: Path) -> Path:
    return d / "nowhere"


def _no_meta(d: Path) -> None:
    (d / "codegen_meta.json").unlink()


def _symlink_out(d: Path) -> None:
    outside = d.parent / f"{d.name}_outside.py"
    outside.write_text("x = 1\n")
    (d / "link.py").symlink_to(outside)
    meta = vf.read_meta(d)
    meta["outputs"]["link.py"] = {"sha256": "0" * 64, "lines": 1}
    vf.save_meta(d, meta)


def _second_modeling(d: Path) -> None:
    (d / "modeling_Other_gen_npu.py").write_text("x = 1\n")


def _drift(d: Path) -> None:
    name = vf.modeling_name(d)
    with open(d / name, "a") as f:
        f.write("# edited by hand\n")


def _output_key(key: str) -> Mutate:
    def fn(meta: dict[str, Any]) -> None:
        meta["outputs"][key] = {"sha256": "0" * 64, "lines": 0}
    return meta_edit(fn)


def _extra_file(d: Path) -> None:
    (d / "notes.txt").write_text("hello\n")


def _strip_attention_marker(source: str) -> str:
    head, sep, tail = source.partition("class LlamaAttention(nn.Module):")
    marker = '    _hp_boundary_form = "tp_collective"\n'
    assert marker in tail
    return head + sep + tail.replace(marker, "", 1)


def _drop(fqn: str, rel: str) -> Callable[[dict[str, Any]], None]:
    def fn(meta: dict[str, Any]) -> None:
        del meta["param_plan"][fqn]["params"][rel]
    return fn


ATTN, MLP, NORM = "model.layers.0.self_attn", "model.layers.0.mlp", "model.norm"
P = "/param_plan"

CASES = [
    # load: unreadable input, exit 2
    Case("invalid_json", raw_meta(b'{"a": 1,,}'), 2, "load", "load.invalid_json", "line 1:9"),
    Case("not_utf8", raw_meta(b'{"a": "\xff"}'), 2, "load", "load.not_utf8", ""),
    Case("top_level_array", raw_meta(b"[1, 2]"), 2, "load", "load.not_object", ""),
    Case("no_such_path", _missing, 2, "load", "load.not_found", str),
    Case("dir_without_meta", _no_meta, 2, "load", "load.no_meta", str),
    # schema
    Case("duplicate_key", _dup_key, 1, "schema", "schema.duplicate_key", f"{P}/lm_head/params"),
    Case("missing_signature", meta_edit(lambda m: m.pop("signature"), resign=False), 1,
         "schema", "schema.required", "/signature"),
    Case("placement_torch_spelling", meta_edit(plan_set("lm_head", "in_src", "input", "tp",
                                                        "Shard(0)")),
         1, "schema", "schema.pattern", f"{P}/lm_head/in_src/input/tp"),
    Case("placement_whitespace", meta_edit(plan_set("lm_head", "in_dst", "input", "tp", "S( 1)")),
         1, "plan", "plan.bad_placement", f"{P}/lm_head/in_dst/input/tp"),
    Case("placement_bad_op", meta_edit(plan_set(ATTN, "out_src", "attn_output", "tp", "P(foo)")),
         1, "schema", "schema.pattern", f"{P}/{ATTN}/out_src/attn_output/tp"),
    Case("sha256_not_hex", meta_edit(lambda m: m["outputs"]["modeling"].update(sha256="xyz")),
         1, "schema", "schema.pattern", "/outputs/modeling/sha256"),
    Case("negative_lines", meta_edit(lambda m: m["outputs"]["init"].update(lines=-1)),
         1, "schema", "schema.minimum", "/outputs/init/lines"),
    Case("entry_key_typo", meta_edit(plan_set("lm_head", "in_scr", {})), 1, "schema",
         "schema.unknown_key", f"{P}/lm_head/in_scr"),
    Case("match_not_string", meta_edit(lambda m: m["injections"].append({"match": [1]})),
         1, "schema", "schema.type", "/injections/0/match/0"),
    Case("target_not_registered", meta_edit(lambda m: m["injections"].append(
        {"match": ATTN, "local_compute_fn": {"_target_": "nodots"}})),
         1, "targets", "plan.foreign_target", "/injections/0/local_compute_fn/_target_"),
    Case("target_not_a_name", meta_edit(lambda m: m["injections"].append(
        {"match": ATTN, "local_compute_fn": {"_target_": "os.system; rm"}})),
         1, "schema", "schema.pattern", "/injections/0/local_compute_fn/_target_"),
    Case("covered_not_bool", meta_edit(lambda m: m["covered"].update(sharding_plan="yes")),
         1, "schema", "schema.type", "/covered/sharding_plan"),
    Case("tp_size_zero", meta_edit(lambda m: m["parallel_dims"].update(tp_size=0)),
         1, "schema", "schema.minimum", "/parallel_dims/tp_size"),
    Case("signature_short", meta_edit(lambda m: m.update(signature="abc"), resign=False),
         1, "schema", "schema.pattern", "/signature"),
    # plan
    Case("unknown_axis", meta_edit(plan_set("lm_head", "params", "weight", "xp", "R")),
         1, "plan", "plan.unknown_axis", f"{P}/lm_head/params/weight/xp"),
    Case("out_src_not_in_out_names", meta_edit(plan_set(ATTN, "out_src", "bogus", {"tp": "R"})),
         1, "plan", "plan.unknown_output", f"{P}/{ATTN}/out_src/bogus"),
    Case("boundary_class_unplanned", meta_edit(
        lambda m: m["boundary_classes"].update({"model.ghost": "Ghost"})),
         1, "plan", "plan.boundary_class_unplanned", "/boundary_classes/model.ghost"),
    Case("injection_unplanned", meta_edit(lambda m: m["injections"].append(
        {"match": "model.ghost", "inner_target": "self"})),
         1, "plan", "plan.injection_unplanned", "/injections/0/match"),
    Case("special_handler_unplanned", meta_edit(
        lambda m: m["special_handlers"].update({"model.ghost.weight": "vocab"})),
         1, "plan", "plan.special_handler_unplanned", "/special_handlers/model.ghost.weight"),
    Case("tied_unplanned", meta_edit(lambda m: m["tied_pairs"][0].__setitem__(1, "ghost.weight")),
         1, "plan", "plan.tied_unplanned", "/tied_pairs/0/1"),
    Case("frozen_sharded_unplanned", meta_edit(
        lambda m: m["frozen_sharded_params"].insert(0, "model.ghost.weight")),
         1, "plan", "plan.frozen_sharded_unplanned", "/frozen_sharded_params/0"),
    Case("covered_but_empty", meta_edit(lambda m: m.update(
        param_plan={}, boundary_classes={}, tied_pairs=[], frozen_sharded_params=[])),
         1, "plan", "plan.covered_but_empty", "/covered/sharding_plan"),
    Case("tp_axis_not_in_mesh", meta_edit(lambda m: m.update(mesh_dim_names=["cp"])),
         1, "plan", "plan.axis_not_in_mesh", "/mesh_dim_names"),
    Case("class_contract_differs", meta_edit(plan_set(
        "model.layers.1.self_attn", "in_dst", "hidden_states", {"tp": "S(1)"})),
         1, "plan", "plan.class_contract_differs", f"{P}/model.layers.1.self_attn"),
    Case("partial_grad_unplanned", meta_edit(plan_set(NORM, "partial_grad_params", ["bias"])),
         1, "plan", "plan.partial_grad_params_unplanned", f"{P}/{NORM}/partial_grad_params/0"),
    # outputs
    Case("modeling_drift", _drift, 1, "outputs", "outputs.sha256_drift",
         "/outputs/modeling/sha256"),
    Case("missing_diff", lambda d: next(d.glob("*.diff")).unlink(), 1, "outputs",
         "outputs.missing_file", "/outputs/diff"),
    Case("dotdot_output", _output_key("../evil.py"), 1, "outputs", "outputs.unsafe_name",
         "/outputs/..~1evil.py"),
    Case("absolute_output", _output_key("/etc/passwd"), 1, "outputs", "outputs.unsafe_name",
         "/outputs/~1etc~1passwd"),
    Case("symlink_leaves_dir", _symlink_out, 1, "outputs", "outputs.escapes", "/outputs/link.py"),
    Case("unrecorded_file_is_warning", _extra_file, 0, "outputs", "outputs.unrecorded_file",
         "notes.txt"),
    Case("plan_edited_after_signing", meta_edit(plan_set("lm_head", "params", "weight", "tp",
                                                         "S(1)"), resign=False),
         1, "outputs", "outputs.signature_drift", "/signature"),
    # source
    Case("marker_stripped", source_edit(_strip_attention_marker), 1, "source",
         "source.missing_marker", "LlamaAttention"),
    Case("identity_rewritten", source_edit(lambda s: s.replace(
        "    def forward(self, hidden_states):\n        variance",
        "    def _forward_impl(self, hidden_states):\n        return hidden_states\n\n"
        "    def forward(self, hidden_states):\n        variance")),
         1, "source", "source.identity_rewritten", "LlamaRMSNorm"),
    Case("modeling_syntax_error", source_edit(lambda s: s + "\ndef broken(:\n"), 1, "source",
         "source.syntax", f"line {len(vf.llama_source().splitlines()) + 2}:12"),
    Case("two_modeling_files", _second_modeling, 1, "source", "source.modeling_file_count", ""),
    Case("forward_impl_missing", source_edit(lambda s: s.replace(
        "def _forward_impl(self, x):", "def _compute(self, x):")),
         1, "source", "source.missing_forward_impl", "LlamaMLP"),
    # signature (--hf-config)
    Case("architecture_mismatch", meta_edit(
        lambda m: m["source"].update(architecture="MistralForCausalLM")),
         1, "signature", "signature.architecture", "/source/architecture"),
    Case("structure_mismatch", meta_edit(
        lambda m: m["source"]["structure"].update(hidden_size=128)),
         1, "signature", "signature.structure", "/source/structure/hidden_size"),
    # model (--hf-config)
    Case("param_missing_in_model", meta_edit(plan_set(ATTN, "params", "q_proj.bias",
                                                      {"tp": "R"})),
         1, "model", "model.missing_param", f"{P}/{ATTN}/params/q_proj.bias"),
    Case("plan_fqn_matches_no_module", meta_edit(lambda m: m["param_plan"].update(
        {"model.ghost": {"params": {"weight": {"tp": "R"}}}})),
         1, "model", "model.unknown_module", f"{P}/model.ghost"),
    Case("trainable_param_uncovered", meta_edit(_drop(MLP, "down_proj.weight"), refreeze=True),
         1, "model", "model.uncovered_param", "model.layers.0.mlp.down_proj.weight"),
    Case("heads_not_divisible", meta_edit(lambda m: m["parallel_dims"].update(tp_size=3)),
         1, "model", "model.heads_not_divisible", "/parallel_dims/tp_size"),
    Case("shard_dim_out_of_range", meta_edit(plan_set("lm_head", "params", "weight", "tp",
                                                      "S(2)")),
         1, "model", "model.shard_dim_out_of_range", f"{P}/lm_head/params/weight/tp"),
    Case("module_class_mismatch", meta_edit(
        lambda m: m["boundary_classes"].update(lm_head="Conv1d")),
         1, "model", "model.class_mismatch", "/boundary_classes/lm_head"),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Build every case's artifact once; returns case id -> the path to verify."""
    root = tmp_path_factory.mktemp("corpus")
    paths = {}
    for case in CASES:
        d = vf.build_fixture("llama_hp", root / case.id)
        paths[case.id] = case.mutate(d) or d
    return paths


@pytest.fixture(scope="module")
def batch(corpus: dict[str, Path]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One run of the CLI's entry point (in this process, :mod:`inproc`) verifying the whole
    corpus with --json."""
    proc = inproc.run("verify", *corpus.values(), "--hf-config", CONFIG, "--json", cwd=REPO)
    doc = json.loads(proc.stdout)
    return proc, {a["path"]: a for a in doc["artifacts"]}


def _exit_of(artifact: dict[str, Any]) -> int:
    if "load" in artifact["checks"]:
        return 2
    return 0 if artifact["ok"] else 1


def _has(check: dict[str, Any], code: str, where: str) -> bool:
    return any(f["code"] == code and f["path"] == where for f in check["findings"])


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def test_batch_cli_never_prints_a_traceback(batch: Any) -> None:
    proc, artifacts = batch
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2  # some inputs are unreadable
    assert len(artifacts) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case(case: Case, corpus: dict[str, Path], batch: Any) -> None:
    path = corpus[case.id]
    where = case.where(path) if callable(case.where) else case.where
    out = io.StringIO()
    config = CONFIG if case.check in CONFIG_CHECKS else None
    code = run_verify([path], hf_config=config, output="json", stdout=out, stderr=io.StringIO())
    art = json.loads(out.getvalue())["artifacts"][0]
    assert code == case.exit, json.dumps(art["checks"].get(case.check), indent=1)
    check = art["checks"][case.check]
    assert _has(check, case.code, where), json.dumps(check, indent=1)
    assert check["status"] == ("pass" if case.exit == 0 else "fail")
    cli = batch[1][str(path)]
    assert _exit_of(cli) == case.exit
    assert _has(cli["checks"][case.check], case.code, where)
