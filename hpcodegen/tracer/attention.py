"""Watch a model's calls of transformers' attention interface (lazy torch + transformers).

Every transformers 5 attention module hands its kernel ``(module, query, key, value,
attention_mask, **kwargs)`` through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``,
and every mask is built through ``ALL_MASK_ATTENTION_FUNCTIONS`` under the same name.
:func:`watch_attention` registers a recording implementation under one name, gives every
module holding a config a copy naming it for the duration, and restores the model: the
model's own kernel (its eager function or SDPA, as it was configured) still runs. Used by
``generate --cp``'s probe forward and by ``inspect-plan --hf-config``'s trace (the K/V
shapes the cp all-gathers move).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

NAME = "hpcodegen_watch"
#: ``(on_call, on_mask, implementation)`` of the innermost watch
_WATCHES: list[tuple[Callable[..., None], Callable[..., None] | None, str | None]] = []


def kernel_of(module: Any, implementation: str | None) -> Callable[..., Any]:
    """The kernel ``module`` runs for ``implementation``: a registered one, else the eager
    function of the file defining its class (SDPA when that file has none)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation and implementation != "eager" and implementation in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[implementation]
    found = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if callable(found):
        return found
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
               **kwargs: Any) -> Any:
    on_call, _, implementation = _WATCHES[-1]
    with on_call(module, query, key, value, kwargs, attention_mask):
        return kernel_of(module, implementation)(module, query, key, value, attention_mask,
                                                 **kwargs)


def _mask(*args: Any, **kwargs: Any) -> Any:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    _, on_mask, implementation = _WATCHES[-1]
    inner = implementation if implementation in ALL_MASK_ATTENTION_FUNCTIONS else "sdpa"
    mask = ALL_MASK_ATTENTION_FUNCTIONS[inner](*args, **kwargs)
    if on_mask is not None:
        on_mask(kwargs, mask)
    return mask


def _register() -> None:
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, _mask)


@contextmanager
def watch_attention(model: Any, on_call: Callable[..., Any],
                    on_mask: Callable[[dict[str, Any], Any], None] | None = None
                    ) -> Iterator[str | None]:
    """Within the block every attention call first enters ``on_call(module, query, key,
    value, kwargs, attention_mask)`` (a context manager around the kernel call) and every
    mask creation calls ``on_mask(kwargs, mask)`` with the mask it made; yields the model's
    configured implementation."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    _register()
    held = [(m, m.__dict__["config"]) for m in model.modules()
            if hasattr(m.__dict__.get("config"), "_attn_implementation")]
    twins = {id(c): copy.copy(c) for _, c in held}
    for module, config in held:
        twin = twins[id(config)]
        twin._attn_implementation_internal = NAME  # this copy only: sub-configs untouched
        module.config = twin
    _WATCHES.append((on_call, on_mask, implementation))
    try:
        yield implementation
    finally:
        _WATCHES.pop()
        for module, config in held:
            module.config = config


__all__ = ["kernel_of", "watch_attention"]
