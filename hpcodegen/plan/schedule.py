"""Pipeline schedules as data: hpcodegen's own per-rank action lists (pure, no torch).

A pipeline splits the model into ``n_stages`` stages placed on ``pp`` ranks; a schedule says,
for every rank, in which order it runs each stage's forward (``F``), backward (``B``, or the
zero-bubble halves ``I`` = input gradient and ``W`` = weight gradient) for each microbatch,
and where it sends and receives what crosses a stage boundary (``SEND_F``/``RECV_F`` for
activations, ``SEND_B``/``RECV_B`` for their gradients). The text form of one action is the
one ``torch.distributed.pipelining`` reads (``"2F0"``, ``"1RECV_B3"``: stage, kind,
microbatch), so the frozen list can be handed to its runtime unchanged.

Why our own builders: a frozen list must be checkable before any rank starts, and torch
2.13's own 1F1B order fails torch's own validator on the last rank (it starts that rank's
steady state at microbatch 1). Every list built here is checked by
:func:`hpcodegen.plan.schedule_sim.simulate`, which is also what verify runs on a meta's list.

Stage -> rank maps: ``"loop"`` puts stage ``s`` on rank ``s % pp`` (``stages_per_rank``
stages per rank, interleaved); ``"v"`` puts two stages per rank, ``(r, 2pp-1-r)``, so the
first and last stage share rank 0 (zero-bubble V).
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

ActionKind = Literal["F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"]
COMPUTE_KINDS: frozenset[str] = frozenset({"F", "B", "I", "W"})
COMM_KINDS: frozenset[str] = frozenset({"SEND_F", "RECV_F", "SEND_B", "RECV_B"})
_ACTION = re.compile(r"^(\d{1,6})(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d{1,7})$")

#: Per-rank action lists, rank -> actions in execution order.
Actions = dict[int, list["Action"]]


class Action(NamedTuple):
    """One step of one rank: ``stage`` runs ``kind`` on microbatch ``mb`` (a tuple: lists
    of thousands are hashed and compared, in C)."""

    stage: int
    """The pipeline stage index (global, 0 = the stage holding the embedding)."""
    kind: str
    """``F``, ``B``, ``I``, ``W`` (compute) or ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``."""
    mb: int
    """The microbatch index, 0-based."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS


def parse_action(text: str) -> Action:
    """``"2F0"`` -> ``Action(2, "F", 0)``; anything else is a ``ValueError`` naming the form."""
    match = _ACTION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not an action: expected <stage><kind><microbatch> with "
                         "kind one of F B I W SEND_F RECV_F SEND_B RECV_B, e.g. '1F0'")
    return Action(int(match[1]), match[2], int(match[3]))


def expand_action(text: str) -> list[Action]:
    """One action of torch's text form as the compute it runs, in order: ``"2F0"`` ->
    ``[Action(2, "F", 0)]``; an overlapped pair ``"(0F3;3B1)OVERLAP_F_B"`` (DualPipeV) ->
    its halves, which torch's runtime runs one after the other. ``ValueError`` otherwise."""
    if isinstance(text, str) and text.startswith("(") and text.endswith(")OVERLAP_F_B"):
        return [parse_action(part) for part in text[1:-len(")OVERLAP_F_B")].split(";")]
    return [parse_action(text)]


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule name means: its stage map and how it orders compute."""

    name: str
    style: Literal["loop", "v"]
    """The stage -> rank map the schedule needs."""
    stages_per_rank: int | None
    """Fixed stages per rank (1 for single-stage schedules, 2 for V); None: 2 or more."""
    split_backward: bool
    """Backward runs as ``I`` then ``W`` (zero bubble) instead of one ``B``."""
    build: Callable[[int, int, int], Actions]
    """``(pp, n_microbatches, stages_per_rank) -> compute-only actions per rank``."""
    microbatches_per_stage: bool = False
    """The order needs at least one microbatch per stage (``n_microbatches >= n_stages``)."""

    def microbatch_problem(self, pp: int, n_microbatches: int, stages_per_rank: int) -> str:
        """Why ``n_microbatches`` cannot run this schedule at ``pp``; empty when it can."""
        n_stages = pp * (self.stages_per_rank or stages_per_rank)
        if self.microbatches_per_stage and n_microbatches < n_stages:
            return (f"{self.name} needs at least one microbatch per stage: {n_stages} "
                    f"stages at pp={pp}, got {n_microbatches} microbatches")
        return ""


def stage_rank(stage: int, pp: int, style: str) -> int:
    """The rank running ``stage`` under ``style`` (``"loop"`` or ``"v"``)."""
    if style == "v":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def rank_stages(rank: int, pp: int, n_stages: int, style: str) -> list[int]:
    """The stages ``rank`` runs, in increasing order."""
    return [s for s in range(n_stages) if stage_rank(s, pp, style) == rank]


def _gpipe(pp: int, m: int, _v: int) -> Actions:
    """All forwards, then all backwards, one stage per rank."""
    return {r: [Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)]
            for r in range(pp)}


def _one_f_one_b(pp: int, m: int, _v: int) -> Actions:
    """Rank ``r`` runs ``pp-1-r`` warm-up forwards, then alternates F and B, then drains."""
    out: Actions = {}
    for r in range(pp):
        warm = min(pp - 1 - r, m)
        steps = [Action(r, "F", i) for i in range(warm)]
        for i in range(m - warm):
            steps += [Action(r, "F", warm + i), Action(r, "B", i)]
        steps += [Action(r, "B", i) for i in range(m - warm, m)]
        out[r] = steps
    return out


def _interleaved_order(pp: int, m: int, v: int, rank: int, backward: bool) -> list[Action]:
    """Microbatches in rounds of ``pp``; within a round, every local stage in turn (last
    stage first for the backward)."""
    order: list[Action] = []
    for start in range(0, m, pp):
        group = range(start, min(start + pp, m))
        for chunk in (reversed(range(v)) if backward else range(v)):
            order += [Action(rank + chunk * pp, "B" if backward else "F", i) for i in group]
    return order


def _interleaved(pp: int, m: int, v: int) -> Actions:
    """Interleaved 1F1B (Megatron's virtual stages): ``v`` loop-placed stages per rank, a
    warm-up of ``2(pp-1-r) + (v-1)pp`` forwards, then one forward and one backward in turn."""
    out: Actions = {}
    for r in range(pp):
        fwd = _interleaved_order(pp, m, v, r, backward=False)
        bwd = _interleaved_order(pp, m, v, r, backward=True)
        warm = min(2 * (pp - 1 - r) + (v - 1) * pp, len(fwd))
        steps = fwd[:warm]
        for k in range(len(fwd) - warm):
            steps += [fwd[warm + k], bwd[k]]
        steps += bwd[len(fwd) - warm:]
        out[r] = steps
    return out


def _greedy(pp: int, m: int, limit: int) -> Actions:
    """A V-placed zero-bubble order, found by a unit-time list schedule.

    Every action costs one unit (F, I, W). At each unit, an idle rank runs the first ready
    action by priority: an input gradient ``I`` (it unblocks the rank before; the lower
    stage first), then a forward while fewer than ``limit`` microbatches hold activations
    on the rank (the lowest microbatch, the later stage first, so microbatches reach the
    loss), then a deferred weight gradient ``W`` (which fills what would be the bubble).
    Each stage runs each kind in microbatch order, so a rank has at most six candidates.
    """
    n = 2 * pp
    done: dict[tuple[int, str, int], int] = {}  # (stage, kind, mb) -> finish time
    nxt = {(s, k): 0 for s in range(n) for k in "FIW"}
    out: Actions = {r: [] for r in range(pp)}
    held = dict.fromkeys(range(pp), 0)
    never = 1 << 60

    def ready(s: int, k: str, i: int, t: int) -> bool:
        if k == "F":
            return s == 0 or done.get((s - 1, "F", i), never) <= t
        if k == "I":
            return (done.get((s, "F", i), never) <= t
                    and (s == n - 1 or done.get((s + 1, "I", i), never) <= t))
        return done.get((s, "I", i), never) <= t

    t, left = 0, 3 * n * m
    while left:
        for r in range(pp):
            cands = [(k, s, nxt[(s, k)]) for s in sorted(rank_stages(r, pp, n, "v"))
                     for k in "FIW" if nxt[(s, k)] < m and ready(s, k, nxt[(s, k)], t)]
            pick = ([c for c in cands if c[0] == "I"]
                    or sorted((c for c in cands if c[0] == "F" and held[r] < limit),
                              key=lambda c: (c[2], -c[1]))
                    or [c for c in cands if c[0] == "W"])
            if not pick:
                continue
            k, s, i = pick[0]
            done[(s, k, i)] = t + 1
            nxt[(s, k)] += 1
            left -= 1
            out[r].append(Action(s, k, i))
            held[r] += 1 if k == "F" else -1 if k == "W" else 0
        t += 1
        if t > 10 * n * m + 10:  # cannot happen: every action becomes ready eventually
            raise RuntimeError("zero-bubble list schedule made no progress")
    return out


def _zbv(pp: int, m: int, _v: int) -> Actions:
    """Zero-bubble V: the greedy order with at most ``2pp`` microbatch-stages held per rank
    (the activation memory of 1F1B)."""
    return _greedy(pp, m, 2 * pp)


def _dualpipe_v(pp: int, m: int, _v: int) -> Actions:
    """DeepSeek's DualPipeV in torch 2.13's order (``ScheduleDualPipeV``), per rank.

    Rank ``r`` holds stage ``lo = r`` and ``hi = 2pp-1-r``. Phases: ``2(pp-1-r)``
    forwards of ``lo``; ``r+1`` pairs of forwards ``lo, hi``; ``pp-1-r`` rounds of
    ``I(hi)``, a deferred ``W``, ``F(hi)``; the steady state of ``m-2pp+r+1`` rounds of
    ``F(lo) B(hi)`` then ``F(hi) B(lo)``; ``pp-1-r`` rounds of ``B(hi) F(hi) B(lo)``; ``r+1``
    pairs of backwards ``hi, lo``, the later ones split into ``I`` (odd ranks switch before
    ``hi`` of the middle pair, even ranks after it); ``pp-1-r`` rounds of a deferred ``W``
    then a backward of ``lo``; the remaining ``W``. torch marks each steady-state ``F B``
    pair ``OVERLAP_F_B`` and its runtime runs the pair as the forward then the backward:
    the frozen list holds the two halves as consecutive actions, so the checks and the
    simulation see each one, and the runtime computes the same steps in the same order.
    """
    return {r: _dualpipe_v_rank(pp, m, r) for r in range(pp)}


def _dualpipe_v_rank(pp: int, m: int, r: int) -> list[Action]:
    lo, hi = r, 2 * pp - 1 - r
    out: list[Action] = []
    fwd_next, back_next = {lo: 0, hi: 0}, {lo: 0, hi: 0}
    weights: deque[Action] = deque()

    def forward(s: int) -> None:
        out.append(Action(s, "F", fwd_next[s]))
        fwd_next[s] += 1

    def backward(s: int, split: bool) -> None:
        mb = back_next[s]
        back_next[s] += 1
        out.append(Action(s, "I" if split else "B", mb))
        if split:
            weights.append(Action(s, "W", mb))

    def deferred_weight() -> None:
        if weights:
            out.append(weights.popleft())

    for _ in range(2 * (pp - 1 - r)):
        forward(lo)
    for _ in range(r + 1):
        forward(lo)
        forward(hi)
    for _ in range(pp - 1 - r):
        backward(hi, True)
        deferred_weight()
        forward(hi)
    for _ in range(m - 2 * pp + r + 1):
        forward(lo)
        backward(hi, False)
        forward(hi)
        backward(lo, False)
    for _ in range(pp - 1 - r):
        backward(hi, False)
        forward(hi)
        backward(lo, False)
    split, middle = False, (r + 1) // 2
    for i in range(r + 1):
        split = split or (i == middle and r % 2 == 1)
        backward(hi, split)
        split = split or (i == middle and r % 2 == 0)
        backward(lo, split)
    for _ in range(pp - 1 - r):
        deferred_weight()
        backward(lo, split)
    for _ in range(r + 1):
        deferred_weight()
    return out


SCHEDULES: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec(name="GPipe", style="loop", stages_per_rank=1, split_backward=False,
                 build=_gpipe),
    ScheduleSpec(name="1F1B", style="loop", stages_per_rank=1, split_backward=False,
                 build=_one_f_one_b),
    ScheduleSpec(name="Interleaved1F1B", style="loop", stages_per_rank=None,
                 split_backward=False, build=_interleaved),
    ScheduleSpec(name="ZBVZeroBubble", style="v", stages_per_rank=2, split_backward=True,
                 build=_zbv),
    ScheduleSpec(name="DualPipeV", style="v", stages_per_rank=2, split_backward=True,
                 build=_dualpipe_v, microbatches_per_stage=True),
)}


def schedule_spec(name: str) -> ScheduleSpec:
    """The :class:`ScheduleSpec` of ``name``; an unknown name is a ``ValueError`` listing them."""
    spec = SCHEDULES.get(name)
    if spec is None:
        raise ValueError(f"unknown pipeline schedule {name!r}: expected one of "
                         f"{', '.join(SCHEDULES)}")
    return spec


def add_comms(compute: Mapping[int, Sequence[Action]], pp: int, style: str) -> Actions:
    """Insert the sends and receives into compute-only lists, in lockstep.

    Ranks advance together, one compute each per round when its input is there. When a
    compute produces something another rank needs, the sender's ``SEND`` and the
    receiver's ``RECV`` are appended in the same round, so between any two ranks the
    receives are posted in exactly the order of the sends (gloo and NCCL match untagged
    point-to-point messages first in, first out); a receive precedes the compute using it.
    """
    n_stages = 1 + max((a.stage for acts in compute.values() for a in acts), default=-1)
    out: Actions = {r: [] for r in compute}
    posted: dict[int, set[Action]] = {r: set() for r in compute}  # recvs and local computes
    pcs = dict.fromkeys(compute, 0)

    def peer(a: Action) -> tuple[int, Action, Action] | None:
        nxt = a.stage + 1 if a.kind == "F" else a.stage - 1
        if a.kind not in ("F", "B", "I") or not 0 <= nxt < n_stages:
            return None
        dst = stage_rank(nxt, pp, style)
        if dst == stage_rank(a.stage, pp, style):
            return None
        fwd = a.kind == "F"
        return (dst, Action(a.stage, "SEND_F" if fwd else "SEND_B", a.mb),
                Action(nxt, "RECV_F" if fwd else "RECV_B", a.mb))

    def can_run(r: int, a: Action) -> bool:
        if a.kind == "F" and a.stage > 0:
            return bool({Action(a.stage, "RECV_F", a.mb), Action(a.stage - 1, "F", a.mb)}
                        & posted[r])
        if a.kind in ("B", "I") and a.stage < n_stages - 1:
            return bool({Action(a.stage, "RECV_B", a.mb), Action(a.stage + 1, "B", a.mb),
                         Action(a.stage + 1, "I", a.mb)} & posted[r])
        return True

    while any(pcs[r] < len(compute[r]) for r in compute):
        progress = False
        for r in sorted(compute):
            if pcs[r] >= len(compute[r]) or not can_run(r, compute[r][pcs[r]]):
                continue
            a = compute[r][pcs[r]]
            pcs[r] += 1
            progress = True
            out[r].append(a)
            posted[r].add(a)
            link = peer(a)
            if link is not None:
                dst, send, recv = link
                out[r].append(send)
                out[dst].append(recv)
                posted[dst].add(recv)
        if not progress:
            stuck = {r: str(compute[r][pcs[r]]) for r in compute if pcs[r] < len(compute[r])}
            raise ValueError(f"the compute order cannot make progress (deadlock): {stuck}")
    return out


def build_actions(schedule: str, pp: int, n_microbatches: int,
                  stages_per_rank: int = 1) -> Actions:
    """The full per-rank action list (compute and comms) of a named schedule.

    Raises:
        ValueError: an unknown schedule, or sizes it cannot take (the message says which).

    Example::

        acts = build_actions("1F1B", 2, 4)
        [str(a) for a in acts[1]][:3]      # ['1RECV_F0', '1F0', '1B0']
    """
    spec = schedule_spec(schedule)
    v = spec.stages_per_rank or stages_per_rank
    if pp < 1 or n_microbatches < 1:
        raise ValueError(f"pp ({pp}) and microbatches ({n_microbatches}) must be >= 1")
    if spec.stages_per_rank is not None and stages_per_rank not in (1, spec.stages_per_rank):
        raise ValueError(f"{schedule} runs {spec.stages_per_rank} stage(s) per rank, "
                         f"not {stages_per_rank}")
    if spec.stages_per_rank is None and v < 2:
        raise ValueError(f"{schedule} needs 2 or more stages per rank, got {v}")
    problem = spec.microbatch_problem(pp, n_microbatches, v)
    if problem:
        raise ValueError(problem)
    return add_comms(spec.build(pp, n_microbatches, v), pp, spec.style)


def actions_to_json(actions: Mapping[int, Sequence[Action]]) -> dict[str, list[str]]:
    """``{"0": ["0F0", ...], ...}``: the form the meta stores."""
    return {str(r): [str(a) for a in actions[r]] for r in sorted(actions)}


def actions_csv(actions: Mapping[int, Sequence[Action]]) -> str:
    """One line per rank, actions comma-separated: torch's ``compute_comms`` CSV form."""
    return "".join(",".join(str(a) for a in actions[r]) + "\n" for r in sorted(actions))


def actions_digest(actions: Mapping[int, Sequence[Action]]) -> str:
    """sha256 (hex) of :func:`actions_csv`: what ``pipeline.actions_sha256`` records."""
    return hashlib.sha256(actions_csv(actions).encode("ascii")).hexdigest()
