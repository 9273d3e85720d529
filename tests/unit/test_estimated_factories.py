"""Which injected factories inspect-plan counts by estimate (pure; hpcodegen/plan/estimated.py).

Only the existing system's own expert-parallel and context-parallel factories are; any
other target stays opaque (listed, never guessed).
"""

from __future__ import annotations

from hpcodegen.plan.estimated import (
    estimated_dispatch,
    estimated_kv_transitions,
    estimated_kv_wrapper,
)
from hpcodegen.plan.types import Injection, Target

EP = "hyper_parallel.models.x.adapter.distributed.expert_parallel.x_ep_compute_fn"
CP = "hyper_parallel.models.x.adapter.distributed.context_parallel.x_cp_wrapper"


def _inj(**kw) -> Injection:
    return Injection(match="m", **kw)


def test_the_existing_systems_ep_compute_is_estimated_when_ep_runs() -> None:
    assert estimated_dispatch(_inj(local_compute_fn=Target(path=EP), ep_size=2)) == EP
    assert estimated_dispatch(_inj(local_compute_fn=Target(path=EP), ep_size=1)) is None
    assert estimated_dispatch(_inj(local_compute_fn=Target(path=EP))) is None
    other = "somepkg.expert_parallel.fn"  # not the existing system's: stays opaque
    assert estimated_dispatch(_inj(local_compute_fn=Target(path=other), ep_size=2)) is None
    assert estimated_dispatch(None) is None


def test_the_existing_systems_cp_wrapper_gathers_key_and_value() -> None:
    inj = _inj(inner_wrapper=Target(path=CP))
    assert estimated_kv_wrapper(inj) == CP
    assert [(t.name, str(t.src), str(t.dst)) for t in estimated_kv_transitions(inj)] == [
        ("key", "S(2)", "R"), ("value", "S(2)", "R")]
    assert estimated_kv_wrapper(_inj(inner_wrapper=Target(path=EP))) is None
    assert estimated_kv_transitions(_inj(inner_wrapper=Target(path="pkg.context_parallel.w"))) == ()
