"""One process group as the lowered ops use it (the process-group cache of a transition)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class Comm:
    """One process group as the lowered ops use it, resolved on first eager use (the group
    may not exist yet at install): the ``ProcessGroup`` itself, its size and this rank, and
    the option objects its methods take (made once, not per call)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.pg: Any = None
        self.size = self.rank = 0

    def resolve(self) -> Any:
        """The ``ProcessGroup`` (the default group for None), set up on first call."""
        if self.pg is None:
            pg = self.group if self.group is not None else dist.group.WORLD
            self.size, self.rank = dist.get_world_size(pg), dist.get_rank(pg)
            self.sum_opts = dist.distributed_c10d.AllreduceOptions()
            self.sum_opts.reduceOp = dist.ReduceOp.SUM
            self.gather_opts = dist.distributed_c10d.AllgatherOptions()
            self.scatter_opts = dist.distributed_c10d.ReduceScatterOptions()
            self.scatter_opts.reduceOp = dist.ReduceOp.SUM
            self.pg = pg
        return self.pg

    def traced_name(self) -> tuple[str, int, int]:
        """``(group name, size, rank)``: what the compiled-model closures capture."""
        group, size, rank = self.traced()
        return group.group_name, size, rank

    def traced(self) -> tuple[Any, int, int]:
        """``(group, size, rank)`` for the functional collectives (compile-time constants)."""
        group = self.group if self.group is not None else dist.group.WORLD
        return group, dist.get_world_size(group), dist.get_rank(group)

    def size_rank(self) -> tuple[int, int]:
        """``(size, rank)``: compile-time constants under ``torch.compile``, else from the
        group resolved once."""
        from hpcodegen.runtime.collectives.local import compiling

        if compiling():
            return self.traced()[1:]
        self.resolve()
        return self.size, self.rank


def as_comm(group: Any) -> Comm:
    """``group`` itself when it is a :class:`Comm`, else a new one over it."""
    return group if type(group) is Comm else Comm(group)
