"""``hpcodegen launch``: run an artifact on N ranks under torchrun (thin Typer verb)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import QUIET, VERBOSE, app, guarded, verbosity

_HELP = """Run ARTIFACT on a torchrun mesh and report every rank.

Without a script: each rank builds the model (seeded, or safetensors weights from
--model-dir), parallelizes it from the artifact, runs a timed forward, and optionally
--check-parity (logits and gradients vs the unsharded model) and --steps K AdamW steps.
With `-- SCRIPT ARGS`: runs your script on every rank; it calls
hpcodegen.launch.setup() to get (model, mesh_context).

The mesh is ("dp", *plan axes): dp = world size / product of the frozen axis sizes.

Exit codes: 0 every rank succeeded; 1 a rank failed, a check failed or --timeout passed;
2 usage error (bad options, unreadable artifact, impossible world size, missing device).
"""


@app.command("launch", help=_HELP, no_args_is_help=True)
def launch(
    artifact: Path = typer.Argument(..., help="Artifact directory (or its codegen_meta.json)."),
    script: Optional[list[str]] = typer.Argument(
        None, help="After `--`: a user script and its arguments, run on every rank."),
    nproc: int = typer.Option(1, "--nproc", help="Ranks on this node."),
    nnodes: str = typer.Option("1", "--nnodes", help="Nodes: N or MIN:MAX (torchrun)."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", help="This node's rank."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint",
                                                help="host:port of the c10d rendezvous."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", help="Job id for all nodes."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr",
                                              help="Static rendezvous address."),
    master_port: Optional[int] = typer.Option(None, "--master-port",
                                              help="Static rendezvous port."),
    device: str = typer.Option("auto", "--device", help="auto | cuda | npu | cpu."),
    model_dir: Optional[Path] = typer.Option(
        None, "--model-dir", help="HF config.json (+ *.safetensors); default: the artifact."),
    steps: int = typer.Option(0, "--steps", help="AdamW steps on a synthetic batch."),
    check_parity: bool = typer.Option(False, "--check-parity",
                                      help="Compare with the unsharded model."),
    tolerance: Optional[float] = typer.Option(
        None, "--tolerance", help="Parity max abs diff (default by --dtype)."),
    seed: int = typer.Option(0, "--seed", help="Init and batch seed."),
    compile_on: bool = typer.Option(False, "--compile",
                                    help="torch.compile the parallelized model."),
    compile_scope: str = typer.Option("layers", "--compile-scope", metavar="layers|model",
                                      help="With --compile: each decoder layer or the whole "
                                           "model."),
    compile_backend: Optional[str] = typer.Option(
        None, "--compile-backend", metavar="NAME",
        help="With --compile: torch.compile's backend (default inductor)."),
    timeout: Optional[float] = typer.Option(None, "--timeout",
                                            help="End the whole job after S seconds."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir",
                                           help="Keep per-rank logs and results here."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Print the torchrun command and rank environments."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print the JSON envelope (docs/json.md, launch.md)."),
    dtype: str = typer.Option("fp32", "--dtype", help="Parameter dtype: fp32 | bf16 | fp16."),
    save: Optional[Path] = typer.Option(None, "--save",
                                        help="Write a DCP checkpoint here after the steps."),
    resume: Optional[Path] = typer.Option(None, "--resume",
                                          help="Start from this checkpoint (any tp and dp)."),
    max_grad_norm: Optional[float] = typer.Option(
        None, "--max-grad-norm", help="Clip gradients by this global norm in the steps."),
    allow_target: list[str] = typer.Option(
        [], "--allow-target", metavar="PREFIX",
        help="Trust injection targets under this module prefix (repeatable)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    from hpcodegen.launch.launcher.options import LaunchOptions

    opts = LaunchOptions(
        artifact=artifact, nproc=nproc, nnodes=nnodes, node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, master_addr=master_addr,
        master_port=master_port, device=device, model_dir=model_dir, steps=steps,
        check_parity=check_parity, tolerance=tolerance, seed=seed, timeout=timeout,
        compile=compile_scope if compile_on else None, compile_backend=compile_backend,
        log_dir=log_dir, dry_run=dry_run, json=json_out, script=tuple(script or ()),
        allow_target=tuple(allow_target), verbosity=verbosity(quiet, verbose),
        dtype=dtype, save=save, resume=resume, max_grad_norm=max_grad_norm)

    def call() -> int:
        from hpcodegen.extras import require

        require("runtime", "hpcodegen launch", ("torch", "transformers", "safetensors", "psutil"))
        from hpcodegen.launch.launcher.run import run_launch

        return run_launch(opts)

    raise typer.Exit(guarded("launch", call, as_json=json_out))
