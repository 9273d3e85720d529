"""What generate writes from a recipe, the runtime runs; what it cannot run, generate refuses.
Duplicate keys in a recipe YAML are refused (as verify refuses duplicate JSON keys)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from launching import gloo_launch, ok_doc, rank_env  # tests/, by module name

from hpcodegen.errors import InputError
from hpcodegen.generate.api import GenerateArgs, run_generate
from hpcodegen.generate.sources.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "configs" / "llama"

#: the recipe docs/generate.md shows
DOCUMENTED = '''- match: "model.layers.*.self_attn"
  injections: {inner_wrapper: sdpa_hf}
'''


def test_duplicate_recipe_keys_are_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text('- match: "lm_head"\n  params: {weight: {tp: "S(0)"}}\n'
                      '  params: {weight: {tp: "R"}}\n')
    with pytest.raises(InputError) as info:
        load_recipe(recipe)
    (finding,) = info.value.findings
    assert finding.code == "recipe.duplicate_key" and "'params'" in finding.message
    assert "line 3" in finding.message and finding.file == str(recipe)
    nested = tmp_path / "n.yaml"
    nested.write_text('- match: lm_head\n  params: {weight: {tp: "S(0)", tp: "R"}}\n')
    with pytest.raises(InputError):
        load_recipe(nested)
    err = io.StringIO()
    code = run_generate(GenerateArgs(LLAMA, 2, tmp_path / "o", recipe=recipe), stderr=err)
    assert code == 2 and "occurs twice" in err.getvalue()


def test_unregistered_injection_target_is_refused_before_writing(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text('- match: "model.layers.*.self_attn"\n'
                      '  injections: {inner_wrapper: mypkg.attn.wrap}\n')
    err, out = io.StringIO(), tmp_path / "o"
    code = run_generate(GenerateArgs(LLAMA, 2, out, recipe=recipe), stderr=err)
    assert code == 1 and not out.exists()
    assert "recipe.foreign_target" not in err.getvalue()  # rendered, not the code
    assert "/0/injections/inner_wrapper" in err.getvalue() and str(recipe) in err.getvalue()
    trusted = run_generate(GenerateArgs(LLAMA, 2, out, recipe=recipe,
                                        allow_target=("mypkg",)), stderr=io.StringIO())
    assert trusted == 0  # trusted like launch --allow-target mypkg would


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_documented_sdpa_hf_recipe_generates_verifies_and_launches(tmp_path: Path,
                                                                   gloo) -> None:
    """Generate, verify (every check, the model check included) and launch's rank job with
    ``--check-parity`` on 2 kept gloo ranks (``tests/launching.py``: the environment
    ``launch --nproc 2 --model-dir LLAMA --check-parity`` gives each rank): what is checked
    is that the injected attention runs and matches the unsharded model, not the launching
    (a real ``hpcodegen launch`` is tests/launch's, and the installed console script's is
    tests/cli/test_install.py's), so no launcher, torchrun and two fresh ranks importing
    torch and transformers."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(DOCUMENTED)
    art = tmp_path / "art"
    assert run_generate(GenerateArgs(LLAMA, 2, art, recipe=recipe)) == 0
    meta = json.loads((art / "codegen_meta.json").read_text())
    assert {i["inner_wrapper"] for i in meta["injections"]} == {"sdpa_hf"}

    from hpcodegen.verify import run_verify  # in process: the CLI's own run is tests/cli's

    out, err = io.StringIO(), io.StringIO()
    assert run_verify([art], hf_config=LLAMA, stdout=out, stderr=err) == 0, \
        out.getvalue() + err.getvalue()
    docs = gloo_launch(gloo, 2, {"sdpa_hf": rank_env(art, LLAMA, 2, check_parity=True)})
    ranks = ok_doc(docs, "sdpa_hf")["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:
        assert rank["parity"]["logits_max_diff"] <= 1e-5, rank["parity"]
        assert rank["parity"]["grad_max_diff"] <= 1e-5, rank["parity"]
