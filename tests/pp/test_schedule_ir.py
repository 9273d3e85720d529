"""hpcodegen's own pipeline action lists: built, validated and timed without torch.

The bubble figures are the facts measured on torch 2.13's IR (F=1, B=2, I=W=1, comms free):
pp4 m8: GPipe = 1F1B = 3/11, Interleaved1F1B (2 stages per rank) 0.158, ZBV 0.059.
"""

import subprocess
import sys

import pytest

from hpcodegen.plan.schedule import (
    Action,
    actions_digest,
    add_comms,
    build_actions,
    expand_action,
    parse_action,
    schedule_spec,
)
from hpcodegen.plan.schedule_sim import simulate

SHAPES = [(2, 1), (2, 4), (3, 5), (4, 6), (4, 8), (8, 16)]


def _sim(name, pp, m, v=1, actions=None):
    spec = schedule_spec(name)
    v = spec.stages_per_rank or v
    acts = actions if actions is not None else build_actions(name, pp, m, v)
    n = pp * v
    return simulate(acts, pp=pp, n_stages=n, n_microbatches=m, style=spec.style)


@pytest.mark.parametrize(("name", "v", "p4m8", "p8m32"), [
    ("GPipe", 1, 3 / 11, 7 / 39), ("1F1B", 1, 3 / 11, 7 / 39),
    ("Interleaved1F1B", 2, 0.158, 0.099), ("ZBVZeroBubble", 2, 0.059, 0.035),
    ("DualPipeV", 2, 0.059, 0.035)])
def test_bubble_fractions_match_the_measured_facts(name, v, p4m8, p8m32):
    assert _sim(name, 4, 8, v).bubble == pytest.approx(p4m8, abs=1e-3)
    assert _sim(name, 8, 32, v).bubble == pytest.approx(p8m32, abs=1e-3)


@pytest.mark.parametrize("name", ["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
@pytest.mark.parametrize(("pp", "m"), SHAPES)
def test_every_built_list_is_valid(name, pp, m):
    sim = _sim(name, pp, m, 2)
    assert sim.ok, sim.problems[:3]
    assert 0 <= sim.bubble < 1
    # every boundary crosses ranks but V's middle one (stages pp-1 and pp share a rank)
    n_cross = len(sim.in_flight) - 1 - (name == "ZBVZeroBubble")
    assert sim.sends == {"SEND_F": n_cross * m, "SEND_B": n_cross * m}


def test_1f1b_holds_pp_minus_rank_microbatches():
    assert _sim("1F1B", 4, 8).in_flight == {0: 4, 1: 3, 2: 2, 3: 1}
    assert _sim("GPipe", 4, 8).in_flight == {0: 8, 1: 8, 2: 8, 3: 8}


def _edit(acts, rank, fn):
    out = {r: list(a) for r, a in acts.items()}
    out[rank] = fn(out[rank])
    return out


def test_backward_before_forward_is_refused():
    acts = build_actions("1F1B", 2, 4)

    def swap(a):
        i, j = a.index(Action(1, "F", 0)), a.index(Action(1, "B", 0))
        a[i], a[j] = a[j], a[i]
        return a
    bad = _edit(acts, 1, swap)
    sim = _sim("1F1B", 2, 4, actions=bad)
    assert any(p.code == "order" and p.rank == 1 for p in sim.problems), sim.problems


def test_a_missing_microbatch_and_a_duplicate_are_refused():
    acts = build_actions("GPipe", 2, 2)
    dropped = _edit(acts, 0, lambda a: [x for x in a if str(x) != "0B1"])
    assert any(p.code in ("missing", "comm") for p in _sim("GPipe", 2, 2, actions=dropped).problems)
    doubled = _edit(acts, 0, lambda a: [*a, Action(0, "F", 0)])
    assert any(p.code == "duplicate" for p in _sim("GPipe", 2, 2, actions=doubled).problems)


def test_a_deadlocking_order_is_found_by_simulation():
    """Rank 0 waits for a gradient before sending the activation rank 1 waits for."""
    acts = build_actions("GPipe", 2, 1)
    # rank 0: 0F0 0SEND_F0 0RECV_B0 0B0 -> receive the gradient before sending
    swap = _edit(acts, 0, lambda a: [a[0], a[2], a[3], a[1]])
    sim = _sim("GPipe", 2, 1, actions=swap)
    # the structural check sees the send after the backward is fine; the run deadlocks
    assert any(p.code == "deadlock" for p in sim.problems), sim.problems


def test_receives_out_of_send_order_are_refused():
    acts = build_actions("GPipe", 2, 2)

    def swap_recvs(a):
        idx = [i for i, x in enumerate(a) if x.kind == "RECV_F"]
        a[idx[0]], a[idx[1]] = a[idx[1]], a[idx[0]]
        return a
    bad = _edit(acts, 1, swap_recvs)
    sim = _sim("GPipe", 2, 2, actions=bad)
    assert any(p.code in ("fifo", "deadlock") for p in sim.problems), sim.problems


def test_a_stage_on_the_wrong_rank_is_refused():
    acts = build_actions("1F1B", 2, 2)
    bad = {0: acts[1], 1: acts[0]}
    assert any(p.code == "rank" for p in _sim("1F1B", 2, 2, actions=bad).problems)


def test_action_text_round_trips_and_bad_text_is_a_value_error():
    for text in ("0F0", "12SEND_B3", "3RECV_F10", "7W2"):
        assert str(parse_action(text)) == text
    for bad in ("F0", "0X1", "0F", "0REDUCE_GRAD", 3):
        with pytest.raises(ValueError, match="not an action"):
            parse_action(bad)


def test_sizes_a_schedule_cannot_take_are_refused():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        build_actions("Bogus", 2, 2)
    with pytest.raises(ValueError, match="2 or more stages per rank"):
        build_actions("Interleaved1F1B", 2, 4, 1)
    with pytest.raises(ValueError, match="stage\\(s\\) per rank"):
        build_actions("1F1B", 2, 4, 3)


def test_digest_is_stable_and_order_sensitive():
    a = build_actions("1F1B", 2, 4)
    assert actions_digest(a) == actions_digest(build_actions("1F1B", 2, 4))
    assert actions_digest(a) != actions_digest(_edit(a, 0, lambda x: x[::-1]))


def test_the_schedule_ir_imports_no_torch():
    code = ("import sys; from hpcodegen.plan.schedule import build_actions;"
            "from hpcodegen.plan.schedule_sim import simulate;"
            "simulate(build_actions('ZBVZeroBubble', 4, 8), pp=4, n_stages=8, "
            "n_microbatches=8, style='v'); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def _torch_compute(name, pp, m, v):
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops(name, pp, m, v if v > 1 else None, with_comms=False)
    return {r: [x for a in row if a is not None and "REDUCE" not in str(a)
                for x in expand_action(str(a))] for r, row in enumerate(ops)}


@pytest.mark.parametrize(("name", "pp", "m", "v"), [
    ("GPipe", 4, 8, 1), ("Interleaved1F1B", 4, 8, 2), ("Interleaved1F1B", 2, 4, 2)])
def test_our_compute_order_equals_torchs(name, pp, m, v):
    ours = build_actions(name, pp, m, v)
    assert {r: [a for a in ours[r] if a.is_compute] for r in ours} == _torch_compute(name, pp, m, v)


def test_torchs_1f1b_differs_only_on_the_last_rank_which_ours_gets_right():
    """torch 2.13 starts the last rank's steady state at microbatch 1 (and runs 3F8 with
    m=8); ours runs 3F0..3F7, and its list passes our validator."""
    theirs = _torch_compute("1F1B", 4, 8, 1)
    ours = build_actions("1F1B", 4, 8)
    for r in range(3):
        assert [a for a in ours[r] if a.is_compute] == theirs[r]
    assert Action(3, "F", 8) in theirs[3]
    with pytest.raises(ValueError, match="deadlock"):
        add_comms(theirs, 4, "loop")
    assert _sim("1F1B", 4, 8).ok


def test_torchs_zbv_order_passes_our_validator_with_the_same_bubble():
    theirs = add_comms(_torch_compute("ZBVZeroBubble", 4, 8, 2), 4, "v")
    sim = _sim("ZBVZeroBubble", 4, 8, actions=theirs)
    assert sim.ok and sim.bubble == pytest.approx(_sim("ZBVZeroBubble", 4, 8).bubble, abs=1e-9)


DUALPIPEV_SHAPES = [(2, 4), (2, 7), (3, 6), (3, 10), (4, 8), (4, 11), (8, 16)]


@pytest.mark.parametrize(("pp", "m"), DUALPIPEV_SHAPES)
def test_dualpipev_lists_are_valid_and_mix_whole_and_split_backwards(pp, m):
    sim = _sim("DualPipeV", pp, m)
    assert sim.ok, sim.problems[:3]
    n_cross = 2 * pp - 2  # every boundary but the V's middle one
    assert sim.sends == {"SEND_F": n_cross * m, "SEND_B": n_cross * m}
    kinds = {a.kind for acts in build_actions("DualPipeV", pp, m).values() for a in acts}
    assert {"B", "I", "W"} <= kinds
    # stage s holds 2pp - s microbatches at its peak, whatever m: a whole backward B
    # releases its microbatch as a W does (the count must not grow with m)
    assert sim.in_flight == {s: 2 * pp - s for s in range(2 * pp)}


@pytest.mark.parametrize(("pp", "m"), DUALPIPEV_SHAPES)
def test_our_dualpipev_compute_order_is_torchs_with_overlaps_expanded(pp, m):
    ours = build_actions("DualPipeV", pp, m)
    assert {r: [a for a in ours[r] if a.is_compute] for r in ours} == \
        _torch_compute("DualPipeV", pp, m, 2)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (3, 7), (4, 8)])
def test_torchs_own_dualpipev_comms_pass_our_validator_with_our_bubble(pp, m):
    """torch places an overlapped pair's sends after both halves; our list sends each half's
    output as soon as it is computed. Both are valid and time the same."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops("DualPipeV", pp, m, 2, with_comms=True)
    skip = ("SHARD", "REDUCE")  # FSDP steps torch adds
    theirs = {r: [x for a in row if a is not None and not any(k in str(a) for k in skip)
                  for x in expand_action(str(a))] for r, row in enumerate(ops)}
    sim = _sim("DualPipeV", pp, m, actions=theirs)
    assert sim.ok and sim.bubble == pytest.approx(_sim("DualPipeV", pp, m).bubble, abs=1e-9)


def test_an_overlapped_pair_expands_to_its_halves_in_order():
    assert expand_action("(0F3;3B1)OVERLAP_F_B") == [Action(0, "F", 3), Action(3, "B", 1)]
    assert expand_action("2I0") == [Action(2, "I", 0)]
    with pytest.raises(ValueError, match="not an action"):
        expand_action("(0F3;3X1)OVERLAP_F_B")


def test_dualpipev_needs_a_microbatch_per_stage():
    with pytest.raises(ValueError, match="at least one microbatch per stage: 8 stages at pp=4, "
                                         "got 7"):
        build_actions("DualPipeV", 4, 7)


def _dualpipev_edit(fn):
    acts = build_actions("DualPipeV", 2, 4)
    return _sim("DualPipeV", 2, 4, actions={r: fn(r, list(a)) for r, a in acts.items()})


def test_hand_edited_dualpipev_lists_are_refused():
    def w_first(r, a):  # rank 1's last W before its I
        if r == 1:
            i, j = a.index(Action(1, "I", 3)), a.index(Action(1, "W", 3))
            a[i], a[j] = a[j], a[i]
        return a
    assert any(p.code == "order" and "weight gradient before" in p.message
               for p in _dualpipev_edit(w_first).problems)

    def b_first(r, a):  # stage 3's whole backward of microbatch 1 before its forward
        if r == 0:
            i, j = a.index(Action(3, "F", 1)), a.index(Action(3, "B", 1))
            a[i], a[j] = a[j], a[i]
        return a
    assert any(p.code == "order" and p.rank == 0 for p in _dualpipev_edit(b_first).problems)

    def no_recv(r, a):  # a send with no receive
        return [x for x in a if str(x) != "1RECV_F2"] if r == 1 else a
    assert any(p.code == "comm" and "1RECV_F2 is missing" in p.message
               for p in _dualpipev_edit(no_recv).problems)
