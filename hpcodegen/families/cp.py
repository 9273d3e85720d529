"""The ``cp2`` column of ``bench/coverage.py``: context parallelism at cp 2 per family.

``generate --tp 1 --cp 2`` (refused, with the reason, where a token mixer other than the
attention interface makes it inexact) and ``verify --hf-config``; then, on 2 gloo ranks
with a ``("cp",)`` mesh, the parity of the runtime against the unsharded model on two
batches of 32 tokens: plain and padded (left and right padding: the mask rows at global
positions matter). Each rank feeds its positions of the batch through
:func:`hpcodegen.runtime.cp.shard_batch`, the loss is each rank's share over the global
label count, the gradients are summed over cp, and the logits are put back in order.
"""

from __future__ import annotations

from typing import Any

TOL = 1e-5
SEQ = 32


def _batch(vocab: int, padded: bool, seq: int = SEQ) -> dict[str, Any]:
    import torch

    ids = torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(1))
    batch: dict[str, Any] = {"input_ids": ids,
                             "position_ids": torch.arange(seq).expand(2, -1)}
    if padded:
        mask = torch.ones(2, seq, dtype=torch.long)
        mask[0, :5], mask[1, -7:] = 0, 0
        batch["attention_mask"] = mask
    return batch


def cp_parity_one(artifact: str, config_dir: str, mesh: Any,
                  dtype: str = "float32") -> dict[str, Any]:
    """Worst logits / gradient difference over the plain and padded batches; a float32
    miss runs again with both models in float64 (``exact64``: the same function, float32
    rounding at the model's magnitudes, when that matches)."""
    result = _cp_parity(artifact, config_dir, mesh, dtype)
    if dtype == "float32" and not result["ok"] and not result["odd"]:
        again = _cp_parity(artifact, config_dir, mesh, "float64")
        result["exact64"] = {k: again[k] for k in ("logits", "grad", "ok")}
    return result


def _cp_parity(artifact: str, config_dir: str, mesh: Any, dtype: str) -> dict[str, Any]:
    """The parity harness's :func:`~hpcodegen.parity.harness.compare` on the plain and the
    padded batch; the worse of the two."""
    import torch

    from hpcodegen.parity.harness import build_pair, compare, install, read_config
    from hpcodegen.parity.lengths import smoke_length_for

    pair = build_pair(artifact, read_config(config_dir), dtype=getattr(torch, dtype))
    installed = install(pair, mesh)
    config = pair.reference.config
    vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    # SEQ tokens, bounded by the config's max positions, in whole head-tail chunks of cp 2
    seq = smoke_length_for(config, SEQ, 4, exercise_window=False).length
    worst = {"logits": 0.0, "grad": 0.0, "worst": None, "odd": []}
    for padded in (False, True):
        full = _batch(vocab, padded, seq)
        target = full["input_ids"]
        if padded:
            target = target.masked_fill(full["attention_mask"] == 0, -100)
        shifted = torch.full_like(target, -100)
        shifted[:, :-1] = target[:, 1:]
        r = compare(pair.sharded, pair.reference, pair.plan, installed,
                    {**full, "use_cache": False}, shifted, zero_grad=True)
        worst["logits"] = max(worst["logits"], r.logits)
        if r.grad >= worst["grad"]:
            worst["grad"], worst["worst"] = r.grad, r.worst
        worst["odd"] = worst["odd"] or r.odd
    worst["ok"] = worst["logits"] <= TOL and worst["grad"] <= TOL and not worst["odd"]
    return worst


def cp_cell(row: dict[str, Any]) -> str:
    """The ``cp2`` cell: parity result, or where it stopped."""
    v = row.get("cp2") or {}
    if not v:
        return "-"
    if not v.get("ok"):
        return "refused" if str(v.get("reason", "")).find("--cp:") >= 0 else \
            f"fail ({v.get('stage')})"
    p = (row.get("parity") or {}).get("cp2")
    if not p:
        return "ok (no parity)"
    if p.get("ok"):
        return f"ok ({max(p['logits'], p['grad']):.0e})"
    exact = p.get("exact64") or {}
    if exact.get("ok"):
        return f"ok in fp64 ({max(exact['logits'], exact['grad']):.0e})"
    return "FAIL"


def cp_reason(row: dict[str, Any]) -> str:
    """Why cp2 is not ok ("" when it is)."""
    v = row.get("cp2") or {}
    if v and not v.get("ok"):
        return f"{v.get('stage')}: {v.get('reason')}"
    p = (row.get("parity") or {}).get("cp2")
    if p and not p.get("ok") and (p.get("exact64") or {}).get("ok"):
        return (f"float32 parity misses {TOL:g} by rounding (logits {p['logits']:.1e}, grad "
                f"{p['grad']:.1e} at {p.get('worst')}); in float64 the sharded model "
                f"matches ({p['exact64']['logits']:.0e} / {p['exact64']['grad']:.0e})")
    if p and not p.get("ok"):
        return p.get("error") or (f"parity logits {p.get('logits'):.1e}, grad "
                                  f"{p.get('grad'):.1e} at {p.get('worst')}")
    return ""
