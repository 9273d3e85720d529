"""A rank's peak memory in the smoke job, estimated before anything is allocated.

What a rank of ``launch``'s built-in job holds, by option (``b`` = bytes per element of
``--dtype``; ``S`` = this rank's parameters after sharding, ``F`` = the whole model's):

* the sharded model, ``S*b``; with ``--check-parity`` also the unsharded reference, ``F*b``,
  for the whole job;
* a gradient per parameter once a backward ran (``--check-parity`` or ``--steps``): x2;
  AdamW's two moments with ``--steps``: x4 in all;
* without safetensors weights (a seeded init, no ``--resume``) each model is first built
  whole in float32 (``F*4``) and sharded after: a transient full copy per rank, on the host,
  and on the device too for cuda/npu (the model moves there before its plan is installed);
* the logits of the synthetic batch, gathered whole, in float32 for the loss, with their
  gradient (``3*4`` bytes per logit, per model);
* the activations a backward keeps, per model (:func:`activation_bytes`): per layer
  ``T*(9*H + 2*I)`` elements for the ``T`` tokens of the batch (the inputs of the
  projections, norms and the MLP's wide part, ``H`` the hidden width, ``I`` the MLP's) and
  ``2.5*B*A*L*L`` for the attention scores and probabilities of ``B`` rows of ``L`` tokens
  over ``A`` heads (eager and math attention build them whole; a sliding window is a mask
  over the same square). The sharded model's are divided by its tp size; a forward alone
  (no parity, no steps) holds one layer's at a time. The batch is the bounded smoke batch
  (:mod:`hpcodegen.parity.lengths`), so a model whose activations cannot fit is refused
  here with the figures, not killed by the kernel mid-run.

The peak is the largest of: building the sharded model, building the reference beside it,
and the steady state of parity and steps. On cpu the peak is host memory and every rank of
the node needs it; on an accelerator the device peak is compared with that device's free
memory and the float32 init with the host's. :func:`check` returns the refusal message, or
None when the job fits. The counts come from the real model built on the meta device and
installed with the real plan (``smoke.preflight``): no second rule for what a rank holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: bytes per logit: the logits, their float32 copy for the loss and its gradient
LOGIT_BYTES = 3 * 4
#: AdamW keeps two moments per parameter, in the parameter's dtype
ADAM_STATES = 2


@dataclass(frozen=True)
class JobShape:
    """What the estimate needs, from the model and the launch options.

    Attributes:
        full_numel: parameters of the whole model (a tied pair counted once).
        local_numel: parameters this rank holds after the plan is installed.
        dtype_bytes: bytes per element of ``--dtype``.
        seeded: no weights and no resume: each model is built whole in float32 first.
        parity: ``--check-parity`` (the unsharded reference).
        steps: ``--steps`` (gradients and AdamW state).
        logits_numel: elements of one forward's full logits (batch x sequence x vocab).
        accelerator: the rank's device is not the host (cuda, npu).
        activations: bytes of the activations one backward of the whole (unsharded) model
            keeps (:func:`activation_bytes`); 0 when unknown.
        tp: the plan's tp size (the sharded model's activations are divided by it).
    """

    full_numel: int
    local_numel: int
    dtype_bytes: int
    seeded: bool
    parity: bool
    steps: int
    logits_numel: int
    accelerator: bool
    activations: int = 0
    tp: int = 1


@dataclass(frozen=True)
class ActivationShape:
    """The sizes the activation estimate reads (from the model built on the meta device).

    Attributes:
        rows / length: the smoke batch (``B`` rows of ``L`` tokens).
        hidden: the hidden width ``H``; ``intermediate`` the MLP's ``I``.
        heads: attention heads ``A`` (0: no attention scores).
        layers: the repeated blocks.
    """

    rows: int
    length: int
    hidden: int
    intermediate: int
    heads: int
    layers: int


#: elements kept per token per layer, in units of the hidden and the MLP width
HIDDEN_TERMS, MLP_TERMS = 9, 2
#: elements kept per attention score (the scores, their softmax, its gradient's input)
SCORE_TERMS = 2.5


def activation_bytes(shape: ActivationShape, dtype_bytes: int, backward: bool = True) -> int:
    """Bytes of the activations of one forward of the whole model that a backward keeps
    (module docstring); with ``backward`` False one layer's, freed as the next runs."""
    tokens = shape.rows * shape.length
    per_layer = (tokens * (HIDDEN_TERMS * shape.hidden + MLP_TERMS * shape.intermediate)
                 + SCORE_TERMS * shape.rows * shape.heads * shape.length * shape.length)
    layers = max(1, shape.layers) if backward else 1
    return int(per_layer * layers * dtype_bytes)


@dataclass(frozen=True)
class MemoryNeed:
    """A rank's estimated peak: on its device (the host for cpu) and on the host besides.

    ``parts`` names what makes up the device peak, for the message.
    """

    device: int
    host: int
    parts: tuple[tuple[str, int], ...]


def estimate(job: JobShape) -> MemoryNeed:
    """The peak bytes of one rank (module docstring)."""
    sharded, full = job.local_numel * job.dtype_bytes, job.full_numel * job.dtype_bytes
    init = job.full_numel * 4 if job.seeded else 0  # the float32 build of a whole model
    copies = 1 + (1 if job.parity or job.steps else 0) + (ADAM_STATES if job.steps else 0)
    models = 2 if job.parity else 1
    logits = job.logits_numel * LOGIT_BYTES * models
    steady: list[tuple[str, int]] = [("sharded parameters", sharded)]
    if job.parity:
        steady.append(("unsharded reference", full))
    if copies > 1:
        steady.append(("gradients", sharded + (full if job.parity else 0)))
    if job.steps:
        steady.append(("AdamW state", ADAM_STATES * (sharded + (full if job.parity else 0))))
    steady.append(("logits", logits))
    if job.activations:
        sharded_act = -(-job.activations // max(1, job.tp))
        steady.append(("activations", sharded_act + (job.activations if job.parity else 0)))
    # building: the whole model lands on the device before its plan is installed (seeded)
    whole = full if job.accelerator else init
    phases = {"steady": sum(n for _, n in steady),
              "building the sharded model": whole if job.seeded else sharded,
              "building the reference": sharded + (max(full, whole) if job.parity else 0)}
    return _peak(phases, steady, job.seeded, init if job.accelerator else 0)


def _peak(phases: dict[str, int], steady: list[tuple[str, int]], seeded: bool,
          host: int) -> MemoryNeed:
    """The largest phase, with the steady state's parts named when it is the peak."""
    peak_phase = max(phases, key=lambda k: phases[k])
    parts = tuple(steady) if peak_phase == "steady" \
        else ((peak_phase + (" (float32, whole)" if seeded else ""), phases[peak_phase]),)
    return MemoryNeed(device=phases[peak_phase], host=host, parts=parts)


@dataclass(frozen=True)
class PipelineShape:
    """What a pipelined rank's estimate needs (``meta.pipeline``; see
    :func:`estimate_pipeline`).

    Attributes:
        job: the rank's :class:`JobShape`; its ``local_numel`` is what the rank holds
            after tp (its stages' parameters only, as ``owned_numel``) and its
            ``logits_numel`` the whole batch's logits on the last stage's rank, 0 elsewhere.
        owned_numel: parameters this rank's stages own: the only ones it builds, and they
            get gradients and AdamW state.
        in_flight_bytes: activations this rank's stages keep at their peak under the frozen
            schedule (:func:`hpcodegen.inspect.pipeline.activations_in_flight`, summed over
            the rank's stages, tp-sharded already).
    """

    job: JobShape
    owned_numel: int
    in_flight_bytes: int


def estimate_pipeline(shape: PipelineShape) -> MemoryNeed:
    """The peak bytes of one pp rank: the parameters its stages own (the only ones it
    builds: :func:`hpcodegen.launch.rank.model.build_parallel_model` with ``owns``), their
    gradients and AdamW state, the activations the frozen schedule keeps in flight on its
    stages, the logits on the last stage's rank; with ``--check-parity`` the unsharded
    reference beside it (whole model, whole batch, as :func:`estimate` counts it). A seeded
    build makes the whole model in float32 on the host (sliced, then dropped): on an
    accelerator that is host memory, on the cpu it is the build's peak."""
    job = shape.job
    full = job.full_numel * job.dtype_bytes
    held = owned = shape.owned_numel * job.dtype_bytes
    init = job.full_numel * 4 if job.seeded else 0
    steady: list[tuple[str, int]] = [("parameters held", held)]
    if job.parity:
        steady.append(("unsharded reference", full))
    if job.parity or job.steps:
        steady.append(("gradients", owned + (full if job.parity else 0)))
    if job.steps:
        steady.append(("AdamW state", ADAM_STATES * (owned + (full if job.parity else 0))))
    models = 2 if job.parity else 1
    steady.append(("logits", job.logits_numel * LOGIT_BYTES * models))
    steady.append(("activations in flight", shape.in_flight_bytes))
    if job.parity and job.activations:
        steady.append(("reference activations", job.activations))
    whole = full if job.accelerator else init
    phases = {"steady": sum(n for _, n in steady),
              "building the sharded model": held + (0 if job.accelerator else init),
              "building the reference": held + (max(full, whole) if job.parity else 0)}
    return _peak(phases, steady, job.seeded, init if job.accelerator else 0)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _parts(need: MemoryNeed) -> str:
    return " + ".join(f"{label} {gib(n)}" for label, n in need.parts if n)


def check(need: MemoryNeed, ranks_here: int, host_free: tuple[int, str],
          device_free: tuple[int, str] | None) -> str | None:
    """The refusal, naming the figures, when the need cannot fit; None when it fits.

    ``host_free`` and ``device_free`` are ``(bytes, where the figure comes from)``;
    ``device_free`` is None on cpu (the device is the host, shared by ``ranks_here``).
    """
    free, source = host_free
    if device_free is None:
        total = need.device * ranks_here
        if total > free:
            return (f"each rank needs about {gib(need.device)} of host memory at its peak "
                    f"({_parts(need)}); {ranks_here} rank(s) on this node need "
                    f"{gib(total)}, but {gib(free)} is available ({source})")
        return None
    dev, dev_source = device_free
    if need.device > dev:
        return (f"this rank needs about {gib(need.device)} of device memory at its peak "
                f"({_parts(need)}), but {gib(dev)} is free on its device ({dev_source})")
    if need.host * ranks_here > free:
        return (f"each rank builds the whole model in float32 on the host first "
                f"({gib(need.host)}); {ranks_here} rank(s) on this node need "
                f"{gib(need.host * ranks_here)}, but {gib(free)} is available ({source})")
    return None


HINT = ("drop --check-parity (the unsharded reference and its state are the largest part), "
        "use --dtype bf16, give safetensors weights in --model-dir (no whole float32 build "
        "per rank), --steps 0 (no gradients, no AdamW state), more tp, or fewer ranks per node")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process's memory cgroup may still allocate (v2, else v1); None when it
    has no limit or none is readable."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        cap, used = _read_int(root / limit), _read_int(root / usage)
        if cap is not None and used is not None and cap < 2**60:
            return max(cap - used, 0)
    return None


def host_free() -> tuple[int, str]:
    """Host memory this node's ranks can still take, and where the figure comes from:
    the kernel's MemAvailable, or the memory cgroup's headroom when that is smaller."""
    import psutil

    available = int(psutil.virtual_memory().available)
    headroom = cgroup_headroom()
    if headroom is not None and headroom < available:
        return headroom, "the memory cgroup's limit less its usage"
    return available, "MemAvailable"


def device_free(device: object) -> tuple[int, str] | None:
    """Free bytes of a cuda or npu ``torch.device`` (its own allocator's view of the
    driver's figure); None for cpu."""
    import torch

    kind = getattr(device, "type", "cpu")
    if kind == "cpu":
        return None
    module = getattr(torch, kind)
    free, total = module.mem_get_info(device)
    return int(free), f"{kind} mem_get_info: {gib(int(free))} of {gib(int(total))} free"


def oom_kills() -> int | None:
    """The kernel's count of out-of-memory kills since boot (``/proc/vmstat oom_kill``,
    Linux 4.13+; memory cgroups' kills included); None where it is not readable."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def peak_rss() -> int | None:
    """This process's peak resident memory in bytes: the kernel's high-water mark of its
    own address space (``/proc/self/status`` ``VmHWM``, which an ``exec`` resets, so a
    rank does not inherit the launcher's), else ``getrusage``'s ``ru_maxrss``; None where
    neither is readable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                value, unit = line.split()[1:3]
                return int(value) * (1024 if unit.lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return None
    return int(peak) * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB else
