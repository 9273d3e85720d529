"""The one tracer (:mod:`hpcodegen.tracer`) and the loss-parallel judge built on it.

* the judge decides "elementwise" by torch's op tags, not by a list of names: a pointwise
  op no list ever named (``erf``, ``sin``, ``sqrt``) passes, reductions over the
  vocabulary (``logsumexp``, ``amax``, ``sum``) are refused, naming the aten op and the
  source line; a constant written into a slice passes, a new tensor of the vocabulary's
  size (a factory) does not count as derived;
* each untagged exception is really untagged in this torch (else it is dead weight);
* the pure layer imports neither torch nor the tracer nor inspect's internals, and the
  tracer imports torch only inside its functions;
* the tracer's hooks name a forward's arguments by its signature (``**kwargs`` too) and
  record outputs by position.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hpcodegen
from hpcodegen.errors import PlanError

PACKAGE = Path(hpcodegen.__file__).parent
HEAD = {"is_boundary": True, "params": {"weight": {"tp": "S(0)"}},
        "in_src": {"input": {"tp": "R"}}, "in_dst": {"input": {"tp": "R"}},
        "out_src": {"output": {"tp": "S(-1)"}}, "out_dst": {"output": {"tp": "S(-1)"}},
        "out_names": ["output"]}
VOCAB = 16


def _tiny_lm(post):
    """A meta-device causal LM whose forward returns ``post(logits)`` as its logits."""
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

        def get_output_embeddings(self):
            return self.lm_head

        def forward(self, input_ids, attention_mask=None):
            return Out(post(self.lm_head(self.embed(input_ids))))

    with torch.device("meta"):
        return TinyLM()


def _check(post) -> str:
    from hpcodegen.plan.codec import entries_from_json
    from hpcodegen.tracer.loss_parallel import check_loss_parallel

    notes: list[str] = []
    fqn = check_loss_parallel(_tiny_lm(post), entries_from_json({"lm_head": HEAD}), notes)
    assert notes == []  # the forward ran: the judge saw every op
    return fqn


def _write_const(x):
    x[:, 1:] = 0.5  # slice + copy_ of an expanded constant (stride 0 on the vocabulary)
    return x


@pytest.mark.parametrize("post", [
    lambda x: x.erf(),  # no list of names ever held these
    lambda x: x.sin() + x.cos(),
    lambda x: (x * x + 1.0).sqrt().rsqrt(),
    lambda x: x.sigmoid().logit(),
    _write_const,
], ids=["erf", "sin_cos", "sqrt_rsqrt", "logit", "write_constant"])
def test_pointwise_by_tag_passes(post) -> None:
    assert _check(post) == "lm_head"


def _write_column(x):
    x[..., 0] = 0.0
    return x


@pytest.mark.parametrize(("post", "named"), [
    (lambda x: x.logsumexp(-1, keepdim=True) + x, "aten.logsumexp"),
    (lambda x: x - x.amax(-1, keepdim=True), "aten.amax"),
    (lambda x: x / x.sum(-1, keepdim=True), "aten.sum"),
    (lambda x: x + x.new_ones(VOCAB), f"with an operand of shape ({VOCAB},)"),
    (lambda x: x.transpose(1, 2), "aten.transpose"),
    (_write_column, "an index on the vocabulary dim"),
], ids=["logsumexp", "amax", "sum", "factory_operand", "transpose", "write_column"])
def test_vocab_wide_steps_refused(post, named) -> None:
    with pytest.raises(PlanError) as info:
        _check(post)
    finding = info.value.findings[0]
    assert finding.code == "generate.loss_parallel_postprocess"
    assert named in finding.message and f"{Path(__file__).name}:" in finding.message


def test_untagged_exceptions_are_untagged_and_tags_decide() -> None:
    import torch

    from hpcodegen.tracer.loss_parallel import UNTAGGED_ELEMENTWISE
    from hpcodegen.tracer.ops import is_pointwise

    aten = torch.ops.aten
    assert is_pointwise(aten.erf.default) and is_pointwise(aten.mul.Tensor)
    assert not is_pointwise(aten.sum.dim_IntList) and not is_pointwise(aten._softmax.default)
    for name, reason in UNTAGGED_ELEMENTWISE.items():
        packet = getattr(aten, name)
        assert reason and not all(is_pointwise(getattr(packet, o))
                                  for o in packet.overloads()), name


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_pure_layer_imports_no_torch_no_tracer_no_inspect() -> None:
    """Anywhere in ``hpcodegen/plan`` (function bodies too): the model half of a rule lives
    at the edge (the tracer), not behind a lazy import."""
    banned = ("torch", "transformers", "hpcodegen.tracer", "hpcodegen.inspect",
              "hpcodegen.runtime", "hpcodegen.generate")
    for path in sorted((PACKAGE / "plan").glob("*.py")):
        bad = {m for m in _imports(path) if m.split(".")[0] in banned or m.startswith(banned)}
        assert not bad, (path.name, bad)


def test_tracer_imports_torch_lazily() -> None:
    code = ("import sys\n"
            "import hpcodegen.tracer.model, hpcodegen.tracer.hooks, hpcodegen.tracer.ops\n"
            "import hpcodegen.tracer.loss_parallel, hpcodegen.tracer.attention\n"
            "import hpcodegen.inspect.trace, hpcodegen.generate.layouts.cp_probe\n"
            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_hooks_name_arguments_and_positions() -> None:
    import torch
    from torch import nn

    from hpcodegen.tracer.hooks import Recording, record_tensors, removed

    class Block(nn.Module):
        def forward(self, hidden_states, mask=None, **kwargs):
            return hidden_states * 2, None, kwargs["extra"].to(torch.int32)

    block, recording = Block(), Recording()
    x = torch.zeros(2, 3, device="meta")
    with removed(record_tensors({"b": block}, recording)):
        block(x, extra=torch.zeros(5, dtype=torch.long, device="meta"))
    block(x, extra=torch.zeros(5, dtype=torch.long, device="meta"))  # hooks gone
    assert recording.calls == {"b": 1}
    assert recording.tensors == {("b", "in", "hidden_states"): ((2, 3), None),
                                 ("b", "in", "extra"): ((5,), 8),
                                 ("b", "out", 0): ((2, 3), None),
                                 ("b", "out", 2): ((5,), 4)}
