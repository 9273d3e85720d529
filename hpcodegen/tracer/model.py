"""Build a model on the meta device and run it once: what every tracer user shares.

The meta device gives real structure with no weights and no memory; torch's fake tensor
mode (``fake=True``) additionally lets transformers skip its data-dependent checks (packed
sequences, all-ones masks), which a plain meta tensor cannot answer. Two things never run
on meta and are switched off for a trace: transformers' mask shortcuts that read tensor
values (:func:`use_eager`) and the data-dependent kernels of mixture-of-experts
``experts`` modules (:func:`experts_shape_only`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

from hpcodegen.errors import HpcodegenError, PlanError, error
from hpcodegen.hf import no_cache_kwargs


def build(config: Mapping[str, Any]) -> Any:
    """The meta-device model of an HF config dict; a failure of transformers' constructors
    becomes a PlanError (``trace.build_failed``), never a traceback."""
    from hpcodegen.hf import build_meta_model

    try:
        return build_meta_model(dict(config))
    except HpcodegenError:
        raise
    except Exception as exc:  # model code may reject a config in many ways; report it
        raise PlanError([error("trace.build_failed", "",
                               f"cannot build the model from --hf-config: "
                               f"{type(exc).__name__}: {exc}")]) from None


def use_eager(model: Any) -> None:
    """Eager attention: transformers' mask shortcuts read values meta tensors lack."""
    setter = getattr(model, "set_attn_implementation", None)
    try:
        if callable(setter):
            setter("eager")
            return
    except (ValueError, TypeError, AttributeError):
        pass
    model.config._attn_implementation = "eager"


@contextmanager
def experts_shape_only(model: Any) -> Iterator[None]:
    """Mixture-of-experts ``experts`` modules run shape-only for the duration of a block.

    Their kernels are data-dependent (which experts a token hits: ``nonzero``, grouped
    matmuls with per-expert offsets), which the meta device cannot run; their contract in
    transformers 5.x (the attributes ``use_experts_implementation`` sets) is an output of the
    hidden states' shape, which is all a trace needs. The model is whole again afterwards.
    """
    import torch

    stubbed = []
    for module in model.modules():
        if hasattr(module, "is_concatenated") and hasattr(module, "has_gate"):
            module.forward = lambda hidden_states, *_a, **_k: torch.zeros_like(hidden_states)
            stubbed.append(module)
    try:
        yield
    finally:
        for module in stubbed:
            module.__dict__.pop("forward", None)


@contextmanager
def quiet_fake_tensors() -> Iterator[None]:
    """Silence the fake tensor logger: a failing op is logged there before it raises, and a
    trace reports the failure its own way."""
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        quiet.setLevel(level)


def token_ids(batch: int, seq: int) -> Any:
    """``(batch, seq)`` zero token ids on the meta device."""
    import torch

    return torch.zeros((batch, seq), dtype=torch.long, device="meta")


def forward(model: Any, batch: int, seq: int, *, mask: bool = False,
            fake: bool = False, watch: Any = None, extra: Mapping[str, Any] | None = None
            ) -> Any:
    """One forward of ``model`` on ``(batch, seq)`` meta token ids, without a KV cache,
    under ``no_grad`` and with the experts shape-only; returns what the model returns.

    Args:
        mask: pass an all-ones ``attention_mask``.
        fake: run under torch's fake tensor mode (shapes only, and transformers skips its
            data-dependent checks); its failures are not logged.
        watch: a ``TorchDispatchMode`` entered around the model call, inside the fake
            mode (so it sees every aten op of the forward on fake tensors).
        extra: more keyword inputs of the model call (the cp probe's ``position_ids``).

    Raises:
        whatever the model code raises: callers decide what a failed trace means.
    """
    import torch

    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode: Any = FakeTensorMode(allow_non_fake_inputs=True)
    else:
        mode = nullcontext()
    with quiet_fake_tensors() if fake else nullcontext(), torch.no_grad(), mode, \
            experts_shape_only(model):
        ids = token_ids(batch, seq)  # made inside the fake mode: a fake tensor
        kwargs: dict[str, Any] = {"input_ids": ids}
        if mask:
            kwargs["attention_mask"] = torch.ones_like(ids)
        kwargs.update(extra or {})
        with watch if watch is not None else nullcontext():
            return model(**kwargs, **no_cache_kwargs(model))
