"""What one ``hpcodegen launch`` asks for, checked before anything starts (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcodegen.errors import UsageError, error

#: Default parity tolerance per ``--dtype``: max abs difference of logits, gradients and
#: losses between the sharded and the unsharded model in that dtype (docs/checkpoints.md).
DEFAULT_TOLERANCE: dict[str, float] = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 5e-3}
#: what ``--compile`` accepts: per decoder layer (torchtitan's default) or the whole model
COMPILE_MODES = ("layers", "model")
#: what a ``--compile-backend`` name may look like (torch's registry is asked before start)
_BACKEND_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """The launch request, one field per CLI option.

    Attributes:
        artifact: the artifact directory (or its ``codegen_meta.json``).
        nproc: ranks on this node (torchrun ``--nproc-per-node``).
        nnodes: nodes in the job; an ``int`` string, or torchrun's elastic ``MIN:MAX``.
        node_rank: this node's rank (static rendezvous).
        rdzv_endpoint: ``host:port`` of the c10d rendezvous (multi-node).
        rdzv_id: job id shared by all nodes.
        master_addr: static rendezvous address (with ``master_port``).
        master_port: static rendezvous port.
        device: ``auto``, ``cuda``, ``npu`` or ``cpu``.
        model_dir: HF ``config.json`` (+ optional safetensors weights); default: the artifact.
        steps: AdamW steps of the smoke job on a synthetic batch.
        check_parity: compare logits/gradients (and losses) with the unsharded model.
        tolerance: max abs difference the parity check accepts (None: the dtype's default,
            ``DEFAULT_TOLERANCE``).
        seed: model init and batch seed.
        compile: ``torch.compile`` the parallelized model: ``layers`` (each decoder layer)
            or ``model`` (the whole model); None: eager.
        compile_backend: ``torch.compile``'s ``backend`` with ``compile`` (None: torch's
            default, inductor); checked against torch's registry before any rank starts.
        timeout: seconds before the whole job is ended (None: no limit).
        log_dir: keep per-rank logs and result files here.
        dry_run: print the torchrun command and environments, run nothing.
        json: machine output on stdout.
        script: a user script and its arguments (after ``--``); empty for the smoke job.
        dtype: parameter dtype, ``fp32``, ``bf16`` or ``fp16``.
        save: write a DCP checkpoint here after the steps (a new or empty directory).
        resume: start from this checkpoint (saved at any tp and dp) instead of the weights.
        max_grad_norm: clip gradients by this global norm in the steps.
        allow_target: module prefixes trusted for injection targets (``--allow-target``).
        verbosity: -1 ``--quiet`` (the verdict only), 0, 1 ``-v`` (also the exact command).
    """

    artifact: Path
    nproc: int = 1
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    device: str = "auto"
    model_dir: Path | None = None
    steps: int = 0
    check_parity: bool = False
    tolerance: float | None = None
    seed: int = 0
    compile: str | None = None
    compile_backend: str | None = None
    timeout: float | None = None
    log_dir: Path | None = None
    dry_run: bool = False
    json: bool = False
    script: tuple[str, ...] = field(default_factory=tuple)
    allow_target: tuple[str, ...] = field(default_factory=tuple)
    dtype: str = "fp32"
    save: Path | None = None
    resume: Path | None = None
    max_grad_norm: float | None = None
    verbosity: int = 0

    @property
    def parity_tolerance(self) -> float:
        """``--tolerance``, else the default of ``--dtype``."""
        return self.tolerance if self.tolerance is not None else DEFAULT_TOLERANCE[self.dtype]

    @property
    def multi_node(self) -> bool:
        """Anything but one node with a local rendezvous."""
        return (self.nnodes != "1" or self.rdzv_endpoint is not None
                or self.master_addr is not None or self.node_rank not in (None, 0))

    def min_world_size(self) -> int:
        """``nproc * nnodes`` (for ``MIN:MAX`` nodes, the minimum)."""
        return self.nproc * int(self.nnodes.split(":")[0])

    def check(self) -> None:
        """Refuse impossible requests (UsageError, exit 2) before anything starts."""
        from hpcodegen.bounds import (
            MAX_RANKS,
            MAX_STEPS,
            MAX_TIMEOUT_S,
            SEED_RANGE,
            float_problem,
            int_problem,
        )

        problems = int_problem("launch.nproc", "--nproc", self.nproc, 1, MAX_RANKS)
        problems += self._node_problems()
        problems += int_problem("launch.steps", "--steps", self.steps, 0, MAX_STEPS)
        problems += int_problem("launch.seed", "--seed", self.seed, *SEED_RANGE)
        problems += float_problem("launch.timeout", "--timeout", self.timeout, 0,
                                  MAX_TIMEOUT_S, low_open=True)
        problems += self._checkpoint_problems()
        problems += float_problem("launch.tolerance", "--tolerance", self.tolerance, 0, 1e30)
        if self.compile is not None and self.compile not in COMPILE_MODES:
            problems.append(error("launch.compile", "--compile-scope",
                                  f"--compile-scope {self.compile!r}",
                                  expected=" or ".join(COMPILE_MODES)))
        if self.compile_backend is not None and self.compile is None:
            problems.append(error("launch.compile_backend", "--compile-backend",
                                  "--compile-backend names the backend of --compile, which "
                                  "was not given", hint="add --compile"))
        elif self.compile_backend is not None and not _BACKEND_NAME.fullmatch(
                self.compile_backend):
            problems.append(error("launch.compile_backend", "--compile-backend",
                                  f"--compile-backend {self.compile_backend!r}",
                                  expected="a torch.compile backend name (inductor, aot_eager, "
                                           "...: torch._dynamo.list_backends())"))
        problems += self._log_dir_problems()
        if self.script and (self.steps or self.check_parity):
            problems.append(error("launch.script_options", "--steps/--check-parity",
                                  "--steps and --check-parity drive the built-in smoke job, "
                                  "not a user script", hint="drop them or the script"))
        if self.script and not Path(self.script[0]).is_file():
            problems.append(error("launch.script", self.script[0], "no such script file",
                                  file=self.script[0]))
        if problems:
            raise UsageError(problems)

    def _log_dir_problems(self) -> list:
        """--log-dir: a directory, or one that can be created. Checked with the other
        options, before the model check's child and torchrun start: a log directory that
        cannot be made would otherwise be found only after them (``run._run_dir``)."""
        if self.log_dir is None:
            return []
        if Path(self.log_dir).exists() and not Path(self.log_dir).is_dir():
            return [error("launch.log_dir", "--log-dir",
                          f"{self.log_dir} exists and is not a directory",
                          expected="a directory (created when missing)")]
        from hpcodegen.checkpoint.record import creation_problem

        results = Path(self.log_dir) / "results"  # what the launcher creates first in it
        problem = creation_problem(results)
        if problem is None:
            return []
        return [error("launch.log_dir", "--log-dir", f"cannot create {results}: {problem}")]

    def _checkpoint_problems(self) -> list:
        """--dtype, --save, --resume and --max-grad-norm (the checkpoint itself is read
        later, with the config, by ``run._prepare``)."""
        problems = []
        if self.dtype not in DEFAULT_TOLERANCE:
            problems.append(error("launch.dtype", "--dtype", f"--dtype {self.dtype!r}",
                                  expected=" | ".join(DEFAULT_TOLERANCE)))
        from hpcodegen.bounds import float_problem

        problems += float_problem("launch.max_grad_norm", "--max-grad-norm",
                                  self.max_grad_norm, 0, 1e30, low_open=True)
        if self.script and (self.save or self.resume or self.max_grad_norm is not None):
            problems.append(error("launch.script_options", "--save/--resume/--max-grad-norm",
                                  "--save, --resume and --max-grad-norm drive the built-in "
                                  "smoke job; a script calls setup().save/resume/"
                                  "clip_grad_norm_", hint="drop them or the script"))
        if self.save is not None:
            from hpcodegen.checkpoint.record import check_target
            from hpcodegen.errors import HpcodegenError

            try:
                check_target(self.save)
            except HpcodegenError as exc:
                problems += exc.findings
        return problems

    def _node_problems(self) -> list:
        """--nnodes, --node-rank and --master-port: what torchrun would reject late."""
        problems = []
        from hpcodegen.bounds import MAX_NODES

        parts = self.nnodes.split(":")
        nodes_ok = len(parts) <= 2 and all(
            p.isascii() and p.isdigit() and len(p) <= 8 and 1 <= int(p) <= MAX_NODES
            for p in parts)
        if not nodes_ok:
            problems.append(error("launch.nnodes", "--nnodes", f"--nnodes {self.nnodes[:40]!r}",
                                  expected=f"N or MIN:MAX with integers 1 .. {MAX_NODES}"))
        max_nodes = int(parts[-1]) if nodes_ok else None
        if self.node_rank is not None and (
                self.node_rank < 0 or (max_nodes is not None and self.node_rank >= max_nodes)):
            problems.append(error("launch.node_rank", "--node-rank",
                                  f"--node-rank {self.node_rank}",
                                  expected=f"0 .. {max_nodes - 1} (one per node of --nnodes)"
                                  if max_nodes else ">= 0"))
        if self.master_port is not None and not 0 < self.master_port < 65536:
            problems.append(error("launch.master_port", "--master-port",
                                  f"--master-port {self.master_port}", expected="1 .. 65535"))
        return problems
