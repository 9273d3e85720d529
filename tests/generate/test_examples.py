"""The committed examples: byte-identical regeneration (the CI gate), schema, verify, and the
generated module computing exactly what the transformers class computes."""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from pathlib import Path

import pytest

from hpcodegen.artifact.load import META_NAME
from hpcodegen.generate.examples import EXAMPLES, run_examples

pytestmark = pytest.mark.slow


def test_examples_regenerate_byte_identical(repo: Path, capsys: pytest.CaptureFixture) -> None:
    assert run_examples(check=True, root=repo) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count("up to date") == len(EXAMPLES)


@pytest.mark.parametrize("ex", EXAMPLES, ids=lambda e: Path(e.out).name)
def test_meta_passes_schema(repo: Path, ex) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = repo / "schemas" / "codegen_meta.schema.json"
    if not schema_path.is_file():
        pytest.skip("codegen_meta.schema.json not written yet")
    meta = json.loads((repo / ex.out / META_NAME).read_text())
    jsonschema.Draft202012Validator(json.loads(schema_path.read_text())).validate(meta)
    assert meta["parallel_dims"]["tp_size"] == ex.tp
    assert meta["parallel_dims"]["sequence_parallel"] is ex.sp
    assert meta["source"]["file_path"].startswith("transformers/models/")
    assert not any(str(repo) in p.read_text() for p in (repo / ex.out).iterdir())


@pytest.mark.parametrize("ex", EXAMPLES, ids=lambda e: Path(e.out).name)
def test_verify_passes_with_hf_config(repo: Path, ex, capsys: pytest.CaptureFixture) -> None:
    verify = pytest.importorskip("hpcodegen.verify")
    code = verify.run_verify([repo / ex.out], hf_config=repo / ex.config)
    assert code == 0, capsys.readouterr().out


def _import_generated(artifact: Path):
    """Import the generated module as a synthetic, uniquely named module (no sys.path edit).

    Compiled from its bytes here: a file loader would write ``__pycache__`` into the shipped
    example wherever ``PYTHONDONTWRITEBYTECODE`` is unset, and verify refuses an artifact
    with bytecode beside its modeling file."""
    path = next(artifact.glob("modeling_*_gen_npu.py"))
    name = f"_hpcodegen_test_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@pytest.mark.parametrize("ex", EXAMPLES, ids=lambda e: Path(e.out).name)
def test_generated_module_gives_transformers_logits(repo: Path, ex) -> None:
    torch = pytest.importorskip("torch")
    from hpcodegen.hf import load_transformers_config, model_class_for, read_hf_config

    config, _ = read_hf_config(repo / ex.config)
    meta = json.loads((repo / ex.out / META_NAME).read_text())
    module = _import_generated(repo / ex.out)
    hf_config = load_transformers_config(config)
    torch.manual_seed(0)
    reference = model_class_for(config)(hf_config).eval()
    generated = getattr(module, meta["model_class"])(hf_config).eval()
    assert type(generated).__module__ == module.__name__
    attn = next(m for m in generated.modules() if type(m).__name__.endswith("Attention"))
    # tp_collective; generic under cp, where the CP attention's inner_wrapper makes it so
    assert hasattr(attn, "_forward_impl")
    assert getattr(type(attn), "_hp_boundary_form", None) == (
        None if ex.cp > 1 else "tp_collective")
    generated.load_state_dict(reference.state_dict())
    ids = torch.randint(0, config["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = reference(ids).logits, generated(ids).logits
    assert torch.equal(expected, got)
