"""``generate --loss-parallel`` refuses what a vocab-sharded head cannot run exactly.

* the forward after the head: elementwise steps (soft-capping, a scale, a cast, a slice of
  the sequence) pass; a softmax, a slice of the vocabulary, a full-vocab bias, a write at
  token ids are refused at generate, naming the step and its source line (meta-device
  models of real torch modules);
* a head the plan does not split on the vocabulary (Inkling's rowwise ``lm_head``) and a
  model without a head are refused;
* OPT's ``fc1`` (colwise, output ``S(-1)``, feeding its sibling ``fc2``) is not taken for a
  loss-parallel head: only ``lm_head`` is, in inspect-plan and the launch loss.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.plan.codec import entries_from_json, plan_from_meta

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
HEAD = {"is_boundary": True, "params": {"weight": {"tp": "S(0)"}},
        "in_src": {"input": {"tp": "R"}}, "in_dst": {"input": {"tp": "R"}},
        "out_src": {"output": {"tp": "S(-1)"}}, "out_dst": {"output": {"tp": "S(-1)"}},
        "out_names": ["output"]}
VOCAB = 32


def _tiny_lm(post):
    """A causal-LM-shaped module on the meta device whose forward applies ``post`` to the
    head's logits (``post(self, logits) -> logits``)."""
    import torch
    from torch import nn

    class Out:
        def __init__(self, logits):
            self.logits = logits

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 8)
            self.lm_head = nn.Linear(8, VOCAB, bias=False)
            self.register_buffer("vocab_bias", torch.zeros(VOCAB))

        def get_output_embeddings(self):
            return self.lm_head

        def forward(self, input_ids, attention_mask=None):
            return Out(post(self, self.lm_head(self.embed(input_ids))))

    with torch.device("meta"):
        return TinyLM()


def _check(post, plan=None):
    from hpcodegen.tracer.loss_parallel import check_loss_parallel

    notes: list[str] = []
    entries = entries_from_json({"lm_head": HEAD} if plan is None else plan)
    fqn = check_loss_parallel(_tiny_lm(post), entries, notes)
    assert notes == []  # the check ran
    return fqn


def _softcap(self, x):
    """Gemma-2's final_logit_softcapping."""
    import torch

    x = x.float() / 30.0
    return torch.tanh(x) * 30.0


def _leaky(x):
    """A comparison and a select, entry by entry."""
    import torch

    return torch.where(x > 0, x, x * 0.1)


@pytest.mark.parametrize("post", [
    lambda self, x: x,
    _softcap,
    lambda self, x: x * 0.25 / 4.0 + 1.0,  # Cohere's logit_scale, Granite's logits_scaling
    lambda self, x: x[:, -1:, :].contiguous(),  # a slice of the sequence
    lambda self, x: x.masked_fill(x.new_zeros((*x.shape[:-1], 1), dtype=bool), -1e4),
    lambda self, x: _leaky(x),
])
def test_elementwise_postprocessing_passes(post) -> None:
    assert _check(post) == "lm_head"


@pytest.mark.parametrize(("post", "named"), [
    (lambda self, x: x.softmax(-1), "softmax"),
    (lambda self, x: x[..., : VOCAB - 2], "an index on the vocabulary dim"),
    (lambda self, x: x + self.vocab_bias, f"with an operand of shape ({VOCAB},)"),
    (lambda self, x: x.view(-1, VOCAB), "view"),
])
def test_vocab_wide_postprocessing_refused(post, named) -> None:
    with pytest.raises(PlanError) as info:
        _check(post)
    finding = info.value.findings[0]
    assert finding.code == "generate.loss_parallel_postprocess"
    assert named in finding.message and f"{Path(__file__).name}:" in finding.message


def test_write_at_token_ids_refused() -> None:
    """Chameleon masks image tokens with ``logits[:, :, ids] = min``: global vocabulary ids,
    which on a slice hit other tokens (or nothing)."""
    import torch

    def post(self, x):
        x[:, :, torch.tensor([3, 5], device=x.device)] = -1e4
        return x

    with pytest.raises(PlanError, match="a write into the vocabulary dim"):
        _check(post)


def test_head_not_vocab_sharded_or_missing_refused() -> None:
    rowwise = {**HEAD, "params": {"weight": {"tp": "S(1)"}}}
    with pytest.raises(PlanError) as info:
        _check(lambda self, x: x, {"lm_head": rowwise})
    assert info.value.findings[0].code == "generate.loss_parallel_head"
    assert "S(1)" in info.value.findings[0].message
    with pytest.raises(PlanError, match="not split on the vocabulary"):
        _check(lambda self, x: x, {})
    model = _tiny_lm(lambda self, x: x)
    model.get_output_embeddings = lambda: None
    from hpcodegen.tracer.loss_parallel import check_loss_parallel

    with pytest.raises(PlanError) as info:
        check_loss_parallel(model, entries_from_json({"lm_head": HEAD}))
    assert info.value.findings[0].code == "generate.loss_parallel_no_head"


def _generate(model_dir: Path, out: Path) -> tuple[int, dict]:
    """Exit code and JSON envelope of ``generate --tp 2 --loss-parallel --json``."""
    from hpcodegen.generate.api import GenerateArgs, run_generate

    buf = io.StringIO()
    code = run_generate(GenerateArgs(model_dir, 2, out, loss_parallel=True, as_json=True),
                        buf, io.StringIO())
    return code, json.loads(buf.getvalue())


@pytest.mark.timeout(400)
def test_rowwise_head_refused_at_generate(tmp_path) -> None:
    """Inkling's HF plan shards ``lm_head`` rowwise (its output is all-reduced): nothing
    stays vocab-sharded, so --loss-parallel is refused rather than silently ignored."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "moe"))
    from moe_configs import write_model_dir

    code, doc = _generate(write_model_dir(tmp_path / "inkling", "inkling_text"),
                          tmp_path / "out")
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["generate.loss_parallel_head"]
    assert "lm_head" in doc["findings"][0]["message"]
    assert not (tmp_path / "out" / "codegen_meta.json").exists()


@pytest.mark.timeout(400)
def test_opt_mlp_is_not_a_loss_parallel_head(tmp_path) -> None:
    code, doc = _generate(FAMILIES / "opt", tmp_path / "opt")
    assert code == 0, doc["findings"]
    meta = json.loads((tmp_path / "opt" / "codegen_meta.json").read_text())
    fc1 = meta["param_plan"]["model.decoder.layers.0.fc1"]
    assert fc1["out_dst"]["output"]["tp"] == "S(-1)"  # the shape of a head, but fed to fc2
    assert plan_from_meta(meta).vocab_sharded_heads() == ["lm_head"]


def test_vocab_sharded_heads_leaves_out_a_split_mlp_half() -> None:
    fc2 = {"is_boundary": True, "params": {"weight": {"tp": "S(1)"}},
           "in_src": {"input": {"tp": "S(-1)"}}, "in_dst": {"input": {"tp": "S(-1)"}},
           "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}},
           "out_names": ["output"]}
    meta = {"parallel_dims": {"tp_size": 2, "loss_parallel": True},
            "param_plan": {"lm_head": HEAD, "layers.0.fc1": HEAD, "layers.0.fc2": fc2,
                           "layers.1.up": HEAD}}
    assert plan_from_meta(meta).vocab_sharded_heads() == ["layers.1.up", "lm_head"]
    without = plan_from_meta({**meta, "parallel_dims": {"tp_size": 2}})
    assert without.vocab_sharded_heads() == []


def test_tp_1_refused_and_undeclared_sharded_head_refused() -> None:
    """The flag's plan rules (verify's, :func:`plan_findings`) hold at generate: --tp 1 keeps
    nothing sharded; a plan that leaves the head's logits sharded needs the flag."""
    from hpcodegen.generate.api import build_bundle
    from hpcodegen.tracer.loss_parallel import check_declared

    config = json.loads((Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama"
                         / "config.json").read_text())
    with pytest.raises(PlanError) as info:
        build_bundle(config, 1, False, None, "llama", loss_parallel=True)
    assert [(f.code, f.where) for f in info.value.findings] == [
        ("generate.loss_parallel_without_tp", "/parallel_dims/loss_parallel")]
    assert "tp_size is 1" in info.value.findings[0].message
    with pytest.raises(PlanError) as info:
        check_declared(_tiny_lm(lambda self, x: x), entries_from_json({"lm_head": HEAD}))
    assert [(f.code, f.where) for f in info.value.findings] == [
        ("generate.loss_parallel_undeclared", "lm_head")]
    check_declared(_tiny_lm(lambda self, x: x), entries_from_json({"lm_head": {**HEAD, "out_dst": {
        "output": {"tp": "R"}}}}))
