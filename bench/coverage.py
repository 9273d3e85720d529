"""Which causal-LM families of the installed transformers hpcodegen supports, measured.

The driver: worker processes, timeouts, retries and the output file. What each step does
lives in :mod:`hpcodegen.families` (the tiny configs, the CLI probe, the parity phase on
the library's parity harness, the report and its counting rule).

For every model type of transformers' causal-LM auto mapping (the ``*ForCausalLM`` classes,
and the few older ``*LMHeadModel`` names such as GPT-2's), this script:

1. builds a tiny config from the config class's defaults, shrunk generically: 2 layers
   (more, up to 8, where a per-layer type list needs them to hold every layer kind of a
   hybrid), hidden 64, 4 heads / 2 kv heads, head_dim 16, vocab 256, MLP widths 128,
   4 experts (2 per token), per-layer lists cut to the layer count, token ids clamped into
   the vocab; a composite config's text sub-config is shrunk the same way;
2. runs ``generate`` at tp 2, tp 4 (with 4 kv heads) and tp 2 ``--sp``, ``verify --hf-config``
   on each, and
   ``inspect-plan`` on the tp 2 artifact (through the CLI, in-process, families batched per
   worker process, ``--jobs`` workers at a time);
3. runs the parity check of every tp 2 (and ``--sp``) artifact that verified on 2 real gloo
   ranks: logits and every gradient against the unsharded model (tolerance 1e-5), several
   models per spawn;
4. writes ``docs/models.md``: one row per family (tp2, tp4, sp, parity), the precise reason
   for every family that is not supported, and the last line
   ``coverage: dense_ok=K/N moe_ok=K/N``.

A family counts as ok when tp 2 generates, verifies, inspects and passes parity (in float32,
or, where float32 rounding alone exceeds the bound, in float64: see ``parity_one``), and its
decoder layers are actually split over tp (a plan that only shards the embedding and the
LM head because nothing else has a rule is listed as ``replicated``, not ok). A family is
MoE when its config declares more than one expert or its HF plan shards experts.
Families whose causal-LM class is a bidirectional encoder or the decoder half of a seq2seq
model (transformers' masked-LM and seq2seq mappings) get their own table and are not
counted in ``dense_ok``. Models of a parity spawn that died run again one per spawn.

    python bench/coverage.py                       # every family, docs/models.md
    python bench/coverage.py --families llama,gpt2 --jobs 2 --out out/models.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcodegen.families.catalog import causal_lm_families
from hpcodegen.families.parity import parity_worker
from hpcodegen.families.probe import phase1_worker
from hpcodegen.families.report import merged_rows, render

REPO = Path(__file__).resolve().parents[1]


def _run_batches(batches: list[list[str]], timeout: float, jobs: int) -> list[tuple[int, str]]:
    """Run each argv, ``jobs`` at a time, each with a hard timeout."""
    results: list[tuple[int, str]] = [(-1, "")] * len(batches)
    running: list[tuple[int, subprocess.Popen, float]] = []
    pending = list(enumerate(batches))
    while pending or running:
        while pending and len(running) < jobs:
            i, argv = pending.pop(0)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            running.append((i, proc, time.monotonic()))
        time.sleep(0.5)
        for item in list(running):
            i, proc, started = item
            if proc.poll() is not None:
                results[i] = (proc.returncode, proc.stdout.read() if proc.stdout else "")
                running.remove(item)
            elif time.monotonic() - started > timeout:
                os.killpg(proc.pid, 9)
                proc.wait()
                results[i] = (124, "timeout")
                running.remove(item)
    return results


def run_phase1(families: Mapping[str, str], work: Path, jobs: int, per_worker: int
               ) -> list[dict[str, Any]]:
    items = list(families.items())
    chunks = [items[i:i + per_worker] for i in range(0, len(items), per_worker)]
    argvs = []
    for n, chunk in enumerate(chunks):
        spec = work / f"phase1_{n}.json"
        if spec.is_file() and json.loads(spec.read_text()) == [list(c) for c in chunk] \
                and spec.with_suffix(".out.json").is_file():
            continue  # done by an earlier run in the same --work dir
        spec.write_text(json.dumps(chunk))
        argvs.append([sys.executable, __file__, "--phase1-worker", str(spec)])
    _run_batches(argvs, timeout=120 * per_worker, jobs=jobs)
    rows: dict[str, dict[str, Any]] = {}
    for n, chunk in enumerate(chunks):
        done = work / f"phase1_{n}.out.json"
        for row in json.loads(done.read_text()) if done.is_file() else []:
            rows[row["family"]] = row
        for model_type, cls in chunk:
            rows.setdefault(model_type, {"family": model_type, "class": cls, "moe": False,
                                         "config_error": "worker crashed or timed out"})
    return [rows[k] for k in families]


def _spawn_parity(batches: list[list[list[str]]], work: Path, tag: str
                  ) -> dict[str, dict[str, Any]]:
    """Run each batch of ``[key, artifact, config_dir]`` in one 2-rank spawn; the status per
    key, with a died spawn's last output line for the keys it did not reach."""
    argvs = []
    for n, batch in enumerate(batches):
        spec = work / f"parity_{tag}{n}.json"
        spec.write_text(json.dumps(batch))
        out = work / f"parity_{tag}{n}"
        out.mkdir(exist_ok=True)
        for stale in out.glob("rank*.json"):
            stale.unlink()
        argvs.append([sys.executable, __file__, "--parity-worker", str(spec), str(out)])
    codes = _run_batches(argvs, timeout=60 + 40 * max(len(b) for b in batches), jobs=1) \
        if batches else []
    found: dict[str, dict[str, Any]] = {}
    for n, batch in enumerate(batches):
        ranks = []
        for r in (0, 1):
            f = work / f"parity_{tag}{n}" / f"rank{r}.json"
            ranks.append(json.loads(f.read_text()) if f.is_file() else {})
        code, output = codes[n]
        last = next((ln.strip() for ln in reversed(output.splitlines())
                     if ln.strip() and not ln.startswith(" ")), "")
        for key, _, _ in batch:
            res = [rk.get(key) for rk in ranks]
            if any(x is None for x in res):
                found[key] = {"ok": False, "died": True,
                              "error": f"the parity spawn died or timed out (exit {code})"
                                       + (f": {last[:200]}" if last else "")}
            else:
                found[key] = {"ok": all(x["ok"] for x in res),
                              "logits": max(x.get("logits", 0.0) for x in res),
                              "grad": max(x.get("grad", 0.0) for x in res),
                              "error": next((x["error"] for x in res if x.get("error")), None),
                              "worst": res[0].get("worst"),
                              "odd": res[0].get("odd"), "f64": res[0].get("f64"),
                              "exact64": _exact64(res)}
    return found


def _exact64(per_rank: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ranks' float64 parity of a float32 miss, worst over ranks (None if not run)."""
    runs = [x.get("exact64") for x in per_rank]
    if not all(runs):
        return None
    return {"ok": all(r["ok"] for r in runs), "logits": max(r["logits"] for r in runs),
            "grad": max(r["grad"] for r in runs)}


def run_phase2(rows: list[dict[str, Any]], work: Path, per_spawn: int) -> None:
    """Parity of every artifact that verified, ``per_spawn`` models per spawn; the models a
    died spawn did not reach run again, one per spawn, so one crash blames one family."""
    jobs = []
    for row in rows:
        for variant in ("tp2", "sp", "cp2"):
            v = row.get(variant) or {}
            if v.get("ok"):
                jobs.append([f"{row['family']}/{variant}", v["dir"],
                             str(work / row["family"] / "config")])
    found = _spawn_parity([jobs[i:i + per_spawn] for i in range(0, len(jobs), per_spawn)],
                          work, "")
    lost = [job for job in jobs if found[job[0]].get("died")]
    if per_spawn > 1 and lost:
        found.update(_spawn_parity([[job] for job in lost], work, "alone"))
    by_row = {r["family"]: r for r in rows}
    for key, status in found.items():
        family, variant = key.split("/")
        status.pop("died", None)
        by_row[family].setdefault("parity", {})[variant] = status


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="", help="comma list of model types (default all)")
    parser.add_argument("--jobs", type=int, default=2, help="phase-1 worker processes")
    parser.add_argument("--per-worker", type=int, default=6, help="families per phase-1 worker")
    parser.add_argument("--per-spawn", type=int, default=8, help="parity models per gloo spawn")
    parser.add_argument("--no-parity", action="store_true")
    parser.add_argument("--lock", default="", help="hold this flock file during the parity "
                        "spawns (a shared machine's heavy-job lock)")
    parser.add_argument("--out", default=str(REPO / "docs" / "models.md"))
    parser.add_argument("--work", default="", help="keep artifacts here (default a temp dir)")
    parser.add_argument("--json", default="", help="also write the raw rows here")
    parser.add_argument("--keep", default="", help="the --json rows of an earlier run: the "
                        "families measured now replace theirs, the report shows all")
    parser.add_argument("--phase1-worker", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--parity-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase1_worker:
        spec = Path(args.phase1_worker[0])
        phase1_worker([tuple(x) for x in json.loads(spec.read_text())], spec.parent,
                      spec.with_suffix(".out.json"), REPO)
        return 0
    if args.parity_worker:
        parity_worker(Path(args.parity_worker[0]), Path(args.parity_worker[1]))
        return 0
    import transformers

    families = causal_lm_families()
    if args.families:
        wanted = [f.strip() for f in args.families.split(",") if f.strip()]
        unknown = [f for f in wanted if f not in families]
        if unknown:
            parser.error(f"unknown model types: {', '.join(unknown)}")
        families = {f: families[f] for f in wanted}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hpcodegen-coverage-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = run_phase1(families, work, args.jobs, args.per_worker)
        if not args.no_parity:
            with _locked(args.lock):
                run_phase2(rows, work, args.per_spawn)
        if args.keep:
            rows = merged_rows(json.loads(Path(args.keep).read_text()), rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    text = render(rows, transformers.__version__, time.perf_counter() - start,
                  len(families) if args.keep else None)
    Path(args.out).write_text(text)
    print(text.splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
