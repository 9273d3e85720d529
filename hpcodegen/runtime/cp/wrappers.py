"""The ``inner_wrapper`` factories of attention modules (registered in ``hpcodegen.targets``).

``sdpa_hf`` and ``sdpa_qkv`` are the existing system's registry names for its all-gather
K/V context-parallel attention on the SDPA kernel; the algorithm is the same, so its
artifacts that name them (also as ``hyper_parallel.codegen.inner.<name>``) run with these.
``eager_hf`` is the same on the modeling file's own eager attention (what a model with
attention softcapping needs: SDPA refuses it). Each is called as
``factory(module, **kwargs)`` on the attention module after the plan is installed:

* with a live cp axis (the runtime gave the module its cp state, :mod:`.context`): the
  module's CP kernel (:class:`.attention.CPAttention`: K/V all-gathered over cp, the
  model's kernel on the local queries) is bound as ``module._hp_cp_attention``;
* without one (cp 1): the module only switches to that kernel (its own copy of the config
  with ``_attn_implementation`` set), exactly as the unsharded model with that kernel.

``causal`` (the existing system's kwarg) must agree with the module's own ``is_causal``.

``*_ulysses`` and ``*_hybrid`` (the existing system's registry names for its Ulysses and
hybrid context-parallel attentions; the hybrid takes its ``ulysses_degree`` kwarg) bind the
same CP kernel with the Ulysses exchange around it (:mod:`.ulysses`); the runtime made the
cp state for the method the plan names, which each wrapper checks.
"""

from __future__ import annotations

import copy
from typing import Any

from hpcodegen.errors import PlanError, error


def wrapper_problem(name: str, module: Any, kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """``(code suffix, message)`` when factory ``name`` cannot wrap ``module`` with
    ``kwargs``, else None: the one rule the install applies and verify's model check runs
    first (before any rank starts)."""
    kwargs = dict(kwargs)
    causal = kwargs.pop("causal", None)
    if name.endswith("_hybrid"):
        kwargs.pop("ulysses_degree", None)  # the hybrid's own argument (checked by _wrap)
    if kwargs:
        return "bad_target_args", (f"{name} takes only 'causal'"
                                   f"{' and ulysses_degree' if name.endswith('_hybrid') else ''}"
                                   f", got {sorted(kwargs)}")
    if causal is not None and bool(getattr(module, "is_causal", True)) != bool(causal):
        return "bad_target_args", (f"{name}: causal={causal!r} but {type(module).__name__}."
                                   f"is_causal is {getattr(module, 'is_causal', True)!r}")
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return "bad_target_module", (f"{name} needs a transformers attention module (one "
                                     f"with a config); got {type(module).__name__}")
    return None


def _check_kwargs(name: str, module: Any, kwargs: dict[str, Any]) -> None:
    problem = wrapper_problem(name, module, kwargs)
    if problem is not None:
        raise PlanError([error(f"runtime.{problem[0]}", "inner_wrapper", problem[1])])


def _wrap(name: str, module: Any, kernel: str, kwargs: dict[str, Any],
          method: str = "allgather") -> None:
    kwargs = dict(kwargs)
    degree = kwargs.pop("ulysses_degree", None) if method == "hybrid" else None
    _check_kwargs(name, module, kwargs)
    state = module.__dict__.get("_hp_cp")
    if state is None:
        own = copy.copy(module.config)
        own._attn_implementation = kernel
        module.config = own
        return
    if getattr(module.config, "_attn_implementation", None) != state.name:
        raise PlanError([error(
            "runtime.cp_config", type(module).__name__,
            f"{name}: the module's config does not name the model's CP attention "
            f"({state.name!r}): it would attend to its rank's keys only",
            hint="the attention holds a config the model does not; please report this")])
    want = {"allgather": 1, "ulysses": state.size, "hybrid": degree}[method]
    if want != state.ulysses or (method == "hybrid" and not 1 < state.ulysses < state.size):
        raise PlanError([error(
            "runtime.cp_method", type(module).__name__,
            f"{name} (ulysses_degree {want!r}) on a cp mesh of {state.size} ranks whose "
            f"attentions run {state.ulysses} ranks per all-to-all: every CP attention of a "
            "model runs one method", expected="ulysses_degree with 1 < degree < cp, "
            "dividing cp" if method == "hybrid" else None)])
    from hpcodegen.runtime.cp.attention import CPAttention, eager_kernel, sdpa_kernel
    from hpcodegen.runtime.cp.ulysses import UlyssesExchange

    fn = sdpa_kernel() if kernel == "sdpa" else eager_kernel(module)
    exchange = None if state.a2a is None else \
        UlyssesExchange(state.a2a, state.ulysses, state.a2a_rank)
    module.__dict__["_hp_cp_attention"] = CPAttention(state.kv, fn, kernel == "eager",
                                                      exchange)


def sdpa_hf(module: Any, **kwargs: Any) -> None:
    """All-gather K/V context-parallel attention on transformers' SDPA kernel."""
    _wrap("sdpa_hf", module, "sdpa", kwargs)


def sdpa_qkv(module: Any, **kwargs: Any) -> None:
    """The existing system's name for :func:`sdpa_hf` (its q/k/v-level variant)."""
    _wrap("sdpa_qkv", module, "sdpa", kwargs)


def eager_hf(module: Any, **kwargs: Any) -> None:
    """All-gather K/V context-parallel attention on the modeling file's eager kernel."""
    _wrap("eager_hf", module, "eager", kwargs)


def sdpa_hf_ulysses(module: Any, **kwargs: Any) -> None:
    """Ulysses context-parallel attention (all-to-all over cp) on the SDPA kernel."""
    _wrap("sdpa_hf_ulysses", module, "sdpa", kwargs, "ulysses")


def sdpa_qkv_ulysses(module: Any, **kwargs: Any) -> None:
    """The existing system's name for :func:`sdpa_hf_ulysses` (its q/k/v-level variant)."""
    _wrap("sdpa_qkv_ulysses", module, "sdpa", kwargs, "ulysses")


def eager_hf_ulysses(module: Any, **kwargs: Any) -> None:
    """Ulysses context-parallel attention on the modeling file's eager kernel."""
    _wrap("eager_hf_ulysses", module, "eager", kwargs, "ulysses")


def sdpa_hf_hybrid(module: Any, **kwargs: Any) -> None:
    """Ulysses inside ``ulysses_degree`` cp ranks, K/V all-gathered across those groups."""
    _wrap("sdpa_hf_hybrid", module, "sdpa", kwargs, "hybrid")


def sdpa_qkv_hybrid(module: Any, **kwargs: Any) -> None:
    """The existing system's name for :func:`sdpa_hf_hybrid`."""
    _wrap("sdpa_qkv_hybrid", module, "sdpa", kwargs, "hybrid")


def eager_hf_hybrid(module: Any, **kwargs: Any) -> None:
    """The hybrid on the modeling file's eager kernel."""
    _wrap("eager_hf_hybrid", module, "eager", kwargs, "hybrid")


__all__ = ["eager_hf", "eager_hf_hybrid", "eager_hf_ulysses", "sdpa_hf", "sdpa_hf_hybrid",
           "sdpa_hf_ulysses", "sdpa_qkv", "sdpa_qkv_hybrid", "sdpa_qkv_ulysses",
           "wrapper_problem"]
