"""Check and run a per-rank pipeline action list on paper (pure, no torch).

:func:`simulate` is the one judge of an action list, whoever built it (hpcodegen's builders,
a hand edit, another tool): it reports every structural fault (an action on the wrong rank,
a microbatch run twice or never, a backward before its forward, a send without its receive,
receives posted in another order than the sends between two ranks), then executes the
lists as the ranks would, with sends that do not block and computes that wait for their
inputs, and reports a deadlock as the action each stuck rank waits on. On a valid list it
also gives the timeline under a cost model (F=1, B=2, I=W=1 by default; comms free), the
bubble fraction, the activations held per stage and the point-to-point traffic.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcodegen.plan.schedule import Action, stage_rank

#: Unit costs of the compute kinds (the zero-bubble convention: B = I + W).
DEFAULT_COSTS: Mapping[str, float] = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
_PRODUCER = {"SEND_F": ("F",), "SEND_B": ("B", "I")}


@dataclass(frozen=True, slots=True)
class Problem:
    """One fault of an action list: where (``rank``, position ``index`` in its list; None
    for a fault of the whole list) and what."""

    code: str
    rank: int | None
    index: int | None
    message: str


@dataclass(frozen=True, slots=True)
class Span:
    """One compute of the timeline: ``rank`` runs ``action`` over ``[start, end)``."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass
class Simulation:
    """What :func:`simulate` found; :attr:`ok` when :attr:`problems` is empty."""

    problems: list[Problem] = field(default_factory=list)
    timeline: list[Span] = field(default_factory=list)
    makespan: float = 0.0
    bubble: float = 0.0
    """Idle share of ``pp x makespan`` (0 for a perfect pipeline)."""
    in_flight: dict[int, int] = field(default_factory=dict)
    """Stage -> the most microbatches whose activations it holds at once (forward done,
    backward, or ``W`` when split, not yet)."""
    sends: dict[str, int] = field(default_factory=dict)
    """``{"SEND_F": n, "SEND_B": n}`` over all ranks."""
    sends_per_rank: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _needed_comms(a: Action, n_stages: int, pp: int, style: str
                  ) -> list[tuple[int, Action]]:
    """The ``(rank, comm action)`` pairs a compute requires around it."""
    if a.kind == "F" and a.stage + 1 < n_stages:
        nxt, send, recv = a.stage + 1, "SEND_F", "RECV_F"
    elif a.kind in ("B", "I") and a.stage > 0:
        nxt, send, recv = a.stage - 1, "SEND_B", "RECV_B"
    else:
        return []
    src, dst = stage_rank(a.stage, pp, style), stage_rank(nxt, pp, style)
    if src == dst:
        return []
    return [(src, Action(a.stage, send, a.mb)), (dst, Action(nxt, recv, a.mb))]


def _structure(actions: Mapping[int, Sequence[Action]], pp: int, n_stages: int, m: int,
               style: str) -> list[Problem]:
    total = sum(len(a) for a in actions.values())
    if total < 2 * n_stages * m:  # also bounds the work below by the list's own size
        return [Problem("missing", None, None, f"{total} actions cannot run {n_stages} "
                        f"stages x {m} microbatches (a forward and a backward each: at least "
                        f"{2 * n_stages * m})")]
    out: list[Problem] = []
    if sorted(actions) != list(range(pp)):
        out.append(Problem("ranks", None, None, f"action lists for ranks {sorted(actions)}, "
                           f"expected exactly ranks 0..{pp - 1}"))
    seen: Counter[tuple[int, Action]] = Counter()
    for r, acts in actions.items():
        done: set[Action] = set()
        for i, a in enumerate(acts):
            seen[(r, a)] += 1
            if not 0 <= a.stage < n_stages or not 0 <= a.mb < m:
                out.append(Problem("range", r, i, f"{a}: stage or microbatch out of range "
                                   f"(stages 0..{n_stages - 1}, microbatches 0..{m - 1})"))
                continue
            if stage_rank(a.stage, pp, style) != r:
                out.append(Problem("rank", r, i, f"{a}: stage {a.stage} runs on rank "
                                   f"{stage_rank(a.stage, pp, style)} ({style} map), not {r}"))
            if a.kind in ("B", "I") and Action(a.stage, "F", a.mb) not in done:
                out.append(Problem("order", r, i, f"{a}: backward before its forward "
                                   f"{a.stage}F{a.mb}"))
            if a.kind == "W" and Action(a.stage, "I", a.mb) not in done:
                out.append(Problem("order", r, i, f"{a}: weight gradient before its input "
                                   f"gradient {a.stage}I{a.mb}"))
            producer = _PRODUCER.get(a.kind)
            if producer and not any(Action(a.stage, k, a.mb) in done for k in producer):
                out.append(Problem("order", r, i, f"{a}: sends what {a.stage}"
                                   f"{'/'.join(producer)}{a.mb} has not computed yet"))
            done.add(a)
    out += _completeness(actions, seen, pp, n_stages, m, style)
    return out


def _completeness(actions: Mapping[int, Sequence[Action]], seen: Counter, pp: int,
                  n_stages: int, m: int, style: str) -> list[Problem]:
    out: list[Problem] = []
    for (r, a), n in seen.items():
        if n > 1:
            out.append(Problem("duplicate", r, None, f"{a} appears {n} times on rank {r}"))
    for s in range(n_stages):
        r = stage_rank(s, pp, style)
        for mb in range(m):
            has = {k: seen[(r, Action(s, k, mb))] > 0 for k in "FBIW"}
            if not has["F"]:
                out.append(Problem("missing", r, None, f"{s}F{mb} never runs on rank {r}"))
            if not (has["B"] or (has["I"] and has["W"])) or (has["B"] and (has["I"] or has["W"])):
                out.append(Problem("missing", r, None, f"stage {s} microbatch {mb}: expected "
                                   "one backward, B or both I and W"))
            for k in ("F", "B", "I"):
                if not has[k]:
                    continue
                for rr, comm in _needed_comms(Action(s, k, mb), n_stages, pp, style):
                    if seen[(rr, comm)] == 0:
                        out.append(Problem("comm", rr, None, f"{comm} is missing on rank {rr} "
                                           f"(the boundary after {s}{k}{mb} crosses ranks)"))
    expected = {c for s in range(n_stages) for mb in range(m) for k in "FBI"
                if seen[(stage_rank(s, pp, style), Action(s, k, mb))]
                for c in _needed_comms(Action(s, k, mb), n_stages, pp, style)}
    for r, acts in actions.items():
        for i, a in enumerate(acts):
            if not a.is_compute and (r, a) not in expected:
                out.append(Problem("comm", r, i, f"{a}: no compute on another rank needs it"))
    return out


class _Run:
    """The execution of valid-looking lists: non-blocking sends, waiting computes."""

    def __init__(self, actions: Mapping[int, Sequence[Action]], pp: int, n_stages: int,
                 style: str, costs: Mapping[str, float], stage_cost: Sequence[float] | None):
        self.actions, self.pp, self.n, self.style = actions, pp, n_stages, style
        self.costs, self.stage_cost = costs, stage_cost
        self.finish: dict[tuple[int, Action], float] = {}
        self.channel: dict[tuple[int, int], list[tuple[Action, float]]] = defaultdict(list)
        self.recvd: dict[tuple[int, int], int] = defaultdict(int)
        self.data: dict[tuple[int, Action], float | None] = {}  # posted recv -> send time
        self.clock = dict.fromkeys(actions, 0.0)
        self.problems: list[Problem] = []
        self.timeline: list[Span] = []

    def _dep_time(self, r: int, a: Action) -> float | None:
        """When the inputs of compute ``a`` on rank ``r`` are ready; None: not yet."""
        times: list[float | None] = []
        if a.kind in ("B", "I", "W"):
            times.append(self.finish.get((r, Action(a.stage, "F" if a.kind != "W" else "I",
                                                    a.mb))))
        if a.kind == "F" and a.stage > 0:
            prev = a.stage - 1
            local = stage_rank(prev, self.pp, self.style) == r
            times.append(self.finish.get((r, Action(prev, "F", a.mb))) if local
                         else self._recv_time(r, Action(a.stage, "RECV_F", a.mb)))
        if a.kind in ("B", "I") and a.stage < self.n - 1:
            nxt = a.stage + 1
            if stage_rank(nxt, self.pp, self.style) == r:
                got = [self.finish.get((r, Action(nxt, k, a.mb))) for k in ("B", "I")]
                times.append(min((t for t in got if t is not None), default=None))
            else:
                times.append(self._recv_time(r, Action(a.stage, "RECV_B", a.mb)))
        if any(t is None for t in times):
            return None
        return max((t for t in times if t is not None), default=0.0)

    def _recv_time(self, r: int, recv: Action) -> float | None:
        if (r, recv) not in self.data:
            return None
        if self.data[(r, recv)] is None:  # posted before the send: look again
            self._match(r, recv)
        return self.data[(r, recv)]

    def _match(self, r: int, recv: Action) -> None:
        src_stage = recv.stage - 1 if recv.kind == "RECV_F" else recv.stage + 1
        src = stage_rank(src_stage, self.pp, self.style)
        key = (src, r)
        index = self._recv_index[(r, recv)]
        sent = self.channel[key]
        if index < len(sent):
            send, t = sent[index]
            want = Action(src_stage, "SEND_F" if recv.kind == "RECV_F" else "SEND_B", recv.mb)
            if send != want and not self._mismatch_reported:
                self._mismatch_reported = True
                self.problems.append(Problem(
                    "fifo", r, None, f"rank {r} posts {recv} as receive #{index} from rank "
                    f"{src}, but send #{index} of rank {src} to rank {r} is {send}: "
                    "point-to-point messages match in order, so the data would be crossed"))
            self.data[(r, recv)] = t

    def step(self, r: int, pc: int) -> bool:
        """Run the action at ``pc`` of rank ``r`` if it can start; True when it ran."""
        a = self.actions[r][pc]
        if a.kind.startswith("RECV"):
            src_stage = a.stage - 1 if a.kind == "RECV_F" else a.stage + 1
            key = (stage_rank(src_stage, self.pp, self.style), r)
            self._recv_index[(r, a)] = self.recvd[key]
            self.recvd[key] += 1
            self.data[(r, a)] = None
            self._match(r, a)
            return True
        if a.kind.startswith("SEND"):
            t = max((self.finish[(r, Action(a.stage, k, a.mb))] for k in _PRODUCER[a.kind]
                     if (r, Action(a.stage, k, a.mb)) in self.finish), default=None)
            if t is None:
                return False
            dst_stage = a.stage + 1 if a.kind == "SEND_F" else a.stage - 1
            self.channel[(r, stage_rank(dst_stage, self.pp, self.style))].append((a, t))
            return True
        dep = self._dep_time(r, a)
        if dep is None:
            return False
        cost = self.costs[a.kind] * (self.stage_cost[a.stage] if self.stage_cost else 1.0)
        start = max(self.clock[r], dep)
        self.clock[r] = start + cost
        self.finish[(r, a)] = start + cost
        self.timeline.append(Span(r, a, start, start + cost))
        return True

    def run(self) -> None:
        self._recv_index: dict[tuple[int, Action], int] = {}
        self._mismatch_reported = False
        pcs = dict.fromkeys(self.actions, 0)
        while True:
            progress = False
            for r in sorted(self.actions):
                while pcs[r] < len(self.actions[r]) and self.step(r, pcs[r]):
                    pcs[r] += 1
                    progress = True
            if not progress:
                break
        stuck = {r: pcs[r] for r in self.actions if pcs[r] < len(self.actions[r])}
        if stuck:
            waits = ", ".join(f"rank {r} at #{i} {self.actions[r][i]}" for r, i in stuck.items())
            for r, i in stuck.items():
                self.problems.append(Problem("deadlock", r, i, f"deadlock: {waits} "
                                             "each wait for an input that never comes"))


def simulate(actions: Mapping[int, Sequence[Action]], *, pp: int, n_stages: int,
             n_microbatches: int, style: str, costs: Mapping[str, float] = DEFAULT_COSTS,
             stage_cost: Sequence[float] | None = None) -> Simulation:
    """Validate ``actions`` and, when valid, time them.

    Args:
        actions: rank -> its actions in order (the frozen list).
        pp, n_stages, n_microbatches, style: the pipeline's shape (``style``: ``"loop"``
            or ``"v"``, :func:`hpcodegen.plan.schedule.stage_rank`).
        costs: the duration of each compute kind.
        stage_cost: a multiplier per stage (unequal stages), or None for equal stages.

    Returns:
        A :class:`Simulation`; its ``problems`` are empty exactly when the list is valid.

    Example::

        sim = simulate(build_actions("1F1B", 4, 8), pp=4, n_stages=4, n_microbatches=8,
                       style="loop")
        round(sim.bubble, 3)                      # 0.273 = 3/11
    """
    out = Simulation(problems=_structure(actions, pp, n_stages, n_microbatches, style))
    if out.problems:
        return out
    run = _Run(actions, pp, n_stages, style, costs, stage_cost)
    run.run()
    out.problems = run.problems
    out.timeline = sorted(run.timeline, key=lambda s: (s.start, s.rank))
    out.makespan = max((s.end for s in run.timeline), default=0.0)
    busy = sum(s.end - s.start for s in run.timeline)
    out.bubble = 1.0 - busy / (pp * out.makespan) if out.makespan else 0.0
    out.in_flight = _in_flight(out.timeline, n_stages)
    for r, acts in actions.items():
        counts = Counter(a.kind for a in acts if a.kind.startswith("SEND"))
        out.sends_per_rank[r] = {k: counts.get(k, 0) for k in ("SEND_F", "SEND_B")}
    out.sends = {k: sum(c[k] for c in out.sends_per_rank.values()) for k in ("SEND_F", "SEND_B")}
    return out


def _in_flight(timeline: Sequence[Span], n_stages: int) -> dict[int, int]:
    # a microbatch's activations go with its last backward step: W when split, else B
    # (a schedule may split some microbatches of a stage and not others: DualPipeV)
    split = {(s.action.stage, s.action.mb) for s in timeline if s.action.kind == "W"}
    events: list[tuple[float, int, int]] = []  # (time, release first, stage)
    for s in timeline:
        a = s.action
        if a.kind == "F":
            events.append((s.end, 1, a.stage))
        elif a.kind == ("W" if (a.stage, a.mb) in split else "B"):
            events.append((s.end, 0, a.stage))
    held, peak = Counter(), dict.fromkeys(range(n_stages), 0)
    for _t, grow, stage in sorted(events):
        held[stage] += 1 if grow else -1
        peak[stage] = max(peak[stage], held[stage])
    return peak
