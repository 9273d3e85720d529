"""Injection factories hpcodegen ships (registered in :data:`hpcodegen.targets.BUILTIN_TARGETS`).

A recipe names them (``injections: {inner_wrapper: sdpa_hf}``); the runtime calls each as
``factory(module, **kwargs)`` on the boundary module after the plan is installed.
"""

from __future__ import annotations

import copy
from typing import Any

from hpcodegen.errors import PlanError, error


def sdpa_hf(module: Any, **kwargs: Any) -> None:
    """``inner_wrapper: sdpa_hf``: this attention module runs transformers' SDPA kernel.

    The module gets its own copy of its config with ``_attn_implementation = "sdpa"``, so
    other modules sharing the config keep theirs. The boundary runs in the generic (DTensor)
    form, where SDPA computes on the local heads. Returns None: no child is replaced.
    """
    if kwargs:
        raise PlanError([error("runtime.bad_target_args", "inner_wrapper",
                               f"sdpa_hf takes no arguments, got {sorted(kwargs)}")])
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise PlanError([error("runtime.bad_target_module", "inner_wrapper",
                               f"sdpa_hf needs a transformers attention module (one with a "
                               f"config); got {type(module).__name__}")])
    own = copy.copy(config)
    own._attn_implementation = "sdpa"
    module.config = own
