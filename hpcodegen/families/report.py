"""docs/models.md: one row per family, the status rule and the counting last line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcodegen.families.catalog import family_kind
from hpcodegen.families.cp import cp_cell, cp_reason
from hpcodegen.families.parity import TOL
from hpcodegen.families.probe import uses_package_rules


def _cell(v: Mapping[str, Any] | None) -> str:
    if not v:
        return "-"
    if v.get("ok"):
        return "ok" if v.get("split", True) else "replicated"
    return f"fail ({v.get('stage')})"


def _parity_cell(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "-"
    if p.get("ok"):
        return f"ok ({max(p['logits'], p['grad']):.0e})"
    if _rounding_only(p):
        return f"ok in fp64 ({max(p['exact64']['logits'], p['exact64']['grad']):.0e})"
    return "FAIL"


def _rounding_only(p: Mapping[str, Any]) -> bool:
    """A float32 miss whose float64 run matches: the sharded model computes the unsharded
    model's function; float32 cannot hold 1e-5 at this model's magnitudes."""
    return bool((p.get("exact64") or {}).get("ok")) and not p.get("odd") and not p.get("error")


def _rounding_note(f64: Mapping[str, Any] | None) -> str:
    """What a float64 run of the unsharded model says of a miss: the sharded model is no
    further from the exact answer than the unsharded float32 model (rounding, kept a miss:
    the bound stays absolute), or it is (a real error)."""
    if not f64:
        return ""
    line = (f" (vs float64: sharded logits {f64['sharded_logits']:.1e} / grads "
            f"{f64['sharded_grad']:.1e}, unsharded float32 {f64['unsharded_logits']:.1e} / "
            f"{f64['unsharded_grad']:.1e}")
    rounding = f64["sharded_logits"] <= max(TOL, 2 * f64["unsharded_logits"]) and \
        f64["sharded_grad"] <= max(TOL, 2 * f64["unsharded_grad"])
    return line + (": float32 rounding, not a sharding error)" if rounding else ")")


def classify_row(row: Mapping[str, Any]) -> tuple[str, str]:
    """``(status, reason)`` of one family; status is ok, replicated or unsupported."""
    if row.get("config_error"):
        return "unsupported", f"no tiny model: {row['config_error']}"
    tp2 = row.get("tp2") or {}
    if not tp2.get("ok"):
        return "unsupported", f"tp2 {tp2.get('stage')}: {tp2.get('reason')}"
    par = (row.get("parity") or {}).get("tp2") or {}
    if not par:
        return "unsupported", "tp2 parity: not run (--no-parity)"
    notes = []
    if not par.get("ok") and _rounding_only(par):
        notes.append(f"tp2 parity in float32 misses {TOL:g} by rounding (logits "
                     f"{par['logits']:.1e}, grad {par['grad']:.1e} at {par.get('worst')}"
                     f"{_rounding_note(par.get('f64')).rstrip(')')}); in float64 the "
                     f"sharded model matches ({par['exact64']['logits']:.0e} / "
                     f"{par['exact64']['grad']:.0e})")
    elif not par.get("ok"):
        why = par.get("error") or (f"logits diff {par.get('logits'):.1e}, grad diff "
                                   f"{par.get('grad'):.1e} at {par.get('worst')}"
                                   + _rounding_note(par.get("f64")))
        return "unsupported", f"tp2 parity: {why}"
    if not tp2.get("split"):
        return "replicated", ("no tp rules (no HF base_model_tp_plan, no package rule): only "
                              "the embedding and LM head are split, the layers replicated")
    for variant in ("tp4", "sp"):
        v = row.get(variant) or {}
        if v and not v.get("ok"):
            notes.append(f"{variant} {v.get('stage')}: {v.get('reason')}")
    sp_par = (row.get("parity") or {}).get("sp")
    if sp_par and not sp_par.get("ok") and not _rounding_only(sp_par):
        notes.append(f"sp parity: {sp_par.get('error') or 'mismatch'}")
    return "ok", "; ".join(notes)


def render(rows: list[dict[str, Any]], transformers_version: str, seconds: float,
           measured: int | None = None) -> str:
    """docs/models.md; ``measured``: how many rows this run measured (``--keep`` kept the
    others from an earlier run), when not all."""
    took = f"{seconds:.0f} s" if measured is None else \
        f"{measured} re-measured in {seconds:.0f} s, the others kept from an earlier run"
    lines = [
        "# Model coverage",
        "",
        f"Measured by `bench/coverage.py` against transformers {transformers_version} "
        f"({len(rows)} causal-LM model types, {took}). Each family is a tiny",
        "config built from its config class's defaults (2 layers, hidden 64, 4 heads / 2 kv",
        "heads, vocab 256); `tp2`, `tp4`, `sp` (tp 2 with `--sp`) are `generate` + `verify",
        "--hf-config` (+ `inspect-plan` for tp2); parity is logits and every gradient against",
        f"the unsharded model on 2 gloo ranks (tolerance {TOL:g}; the worst diff is shown).",
        "Where float32 misses the tolerance, the same check runs with both models in float64:",
        "`ok in fp64` means the sharded model matches there, so the float32 miss is rounding",
        "at the model's magnitudes (the unsharded float32 model is as far from the float64",
        "answer; both distances are in the reason), not a sharding error.",
        "`replicated`: the plan verified but splits no decoder layer (no rule names it).",
        "`cp2`: `generate --tp 1 --cp 2` + `verify`, then parity at cp 2 on 2 gloo ranks on a",
        "plain and a padded batch of 32 tokens (`hpcodegen/families/cp.py`); `refused`: generate",
        "names what context parallelism cannot make exact (the reasons are listed below",
        "the tables).",
        "`rules`: hf (transformers' plan), pkg (hpcodegen/generate/rules/<model_type>.yaml),",
        "seeds (found from the model's structure, `hpcodegen/generate/seeds/seeds.py`: no rule",
        "file),",
        "none. Regenerate: `python bench/coverage.py`.",
        "",
    ]
    groups = _groups(rows)
    for title, group in (("Dense decoder families", groups["dense"]),
                         ("MoE families", groups["moe"]),
                         ("Encoder and encoder-decoder families", groups["other"])):
        lines += [f"## {title}", ""]
        if title.startswith("Encoder"):
            lines += ["transformers also maps these to causal-LM classes: a bidirectional "
                      "encoder run with", "`is_decoder=True` (it has a masked-LM head) or the "
                      "decoder half of a seq2seq model.", "They are listed, not counted in "
                      "`dense_ok`.", ""]
        lines += ["| family | rules | tp2 | tp4 | sp | parity tp2 | parity sp | cp2 | status "
                  "| reason |", "|---|---|---|---|---|---|---|---|---|---|"]
        for row in group:
            status, reason = classify_row(row)
            rules = rules_cell(row)
            par = row.get("parity") or {}
            cells = [row["family"], rules, _cell(row.get("tp2")), _cell(row.get("tp4")),
                     _cell(row.get("sp")), _parity_cell(par.get("tp2")),
                     _parity_cell(par.get("sp")), cp_cell(row), status,
                     reason.replace("|", "\\|").replace("\n", " ")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    def count(group: list[dict[str, Any]], status: str) -> int:
        return sum(classify_row(r)[0] == status for r in group)

    dense, moe, other = groups["dense"], groups["moe"], groups["other"]
    lines += ["## Context parallelism (cp2) not ok", "",
              "| family | why |", "|---|---|"]
    lines += [f"| {r['family']} | {cp_reason(r).replace('|', '/').replace(chr(10), ' ')} |"
              for r in rows if cp_reason(r)]
    lines.append("")
    lines.append("cp2: " + ", ".join(
        f"{name} ok={sum(cp_cell(r).startswith('ok') for r in group)}/{len(group)} "
        f"refused={sum(cp_cell(r) == 'refused' for r in group)}"
        for name, group in (("dense", dense), ("moe", moe))))
    lines.append("replicated only (exact, layers not split): "
                 f"dense={count(dense, 'replicated')} moe={count(moe, 'replicated')}")
    lines.append(f"encoder and encoder-decoder families: ok={count(other, 'ok')}/{len(other)} "
                 f"replicated={count(other, 'replicated')}")
    lines.append("")
    lines.append(f"coverage: dense_ok={count(dense, 'ok')}/{len(dense)} "
                 f"moe_ok={count(moe, 'ok')}/{len(moe)}")
    return "\n".join(lines) + "\n"


def _groups(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows by table: dense decoders, MoE (any kind), encoder / encoder-decoder."""
    out: dict[str, list[dict[str, Any]]] = {"dense": [], "moe": [], "other": []}
    for row in rows:
        kind = row.get("kind") or family_kind(row["family"])
        out["moe" if row.get("moe") else "dense" if kind == "decoder" else "other"].append(row)
    return out


def merged_rows(kept: Sequence[Mapping[str, Any]], fresh: Sequence[Mapping[str, Any]]
                ) -> list[Mapping[str, Any]]:
    """``kept`` (an earlier run's rows) with each family measured again replaced by its
    ``fresh`` row, new families last: a change that touches a few families re-measures
    those, not all (``bench/coverage.py --keep``)."""
    by_family = {row["family"]: row for row in kept}
    by_family.update({row["family"]: row for row in fresh})
    order = [row["family"] for row in kept]
    order += [row["family"] for row in fresh if row["family"] not in order]
    return [by_family[name] for name in order]


def rules_cell(row: Mapping[str, Any]) -> str:
    """Where the tp2 plan's rules came from: ``pkg`` (a package rule file), ``hf``
    (transformers' plan), ``seeds`` (the model's structure) or ``none``."""
    tp2 = row.get("tp2") or {}
    if tp2.get("package") or uses_package_rules(row["family"]):
        return "pkg"
    if row.get("hf_plan"):
        return "hf"
    return "seeds" if tp2.get("seeded") else "none"
