"""The hand-written Megatron-style Llama: the lower bound of ``forward_overhead.py``.

Weights sliced by hand, collectives called by hand on local tensors (Megatron's f/g
operators as autograd functions when a gradient is needed), transformers' math. Kept apart
so the benchmark script reads as arms and measurements; ``tests/bench`` checks this model
against transformers' (logits and gradients).
"""

from __future__ import annotations

from typing import Any


def _gather_last(x: Any, group: Any) -> Any:
    """all_gather of equal shards, concatenated on the last dim."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    out = x.new_empty((world * x.shape[0], *x.shape[1:]))
    dist.all_gather_single(out, x.contiguous(), group=group)
    return torch.cat(out.chunk(world, dim=0), dim=-1)


def _all_reduce_(x: Any, group: Any) -> Any:
    import torch.distributed as dist

    dist.all_reduce(x, group=group)
    return x


def _collective_functions(differentiable: bool) -> tuple[Any, Any, Any]:
    """Megatron's f / g / gather operators over bare torch.distributed.

    f (enter a tp region): identity forward, all_reduce backward. g (leave a rowwise
    region): all_reduce forward, identity backward. gather: all_gather on the last dim
    forward, keep the local slice backward. Without autograd they are plain calls.
    """
    import torch
    import torch.distributed as dist

    if not differentiable:
        return (lambda x, group: x), _all_reduce_, _gather_last

    class EnterTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, group: Any) -> Any:
            ctx.group = group
            return x

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return _all_reduce_(grad.contiguous(), ctx.group), None

    class LeaveTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, group: Any) -> Any:
            ctx.mark_dirty(x)
            return _all_reduce_(x, group)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad, None

    class GatherLast(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, group: Any) -> Any:
            ctx.world, ctx.rank = dist.get_world_size(group), dist.get_rank(group)
            return _gather_last(x, group)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad.chunk(ctx.world, dim=-1)[ctx.rank].contiguous(), None

    return EnterTP.apply, LeaveTP.apply, GatherLast.apply


class HandwrittenLlama:
    """Llama at tp over local tensors: weights sliced by hand, collectives called by hand.

    No module hooks, no DTensor, no nn.Module calls: the least a TP forward can cost here,
    with transformers' math (RMSNorm in fp32, RoPE, causal GQA SDPA, SiLU MLP).
    """

    def __init__(self, full_model: Any, mesh: Any) -> None:
        import torch

        self.group = mesh.get_group()
        rank, world = mesh.get_local_rank(), mesh.size()
        cfg = full_model.config
        self.head_dim, self.eps = cfg.head_dim, cfg.rms_norm_eps
        self.inv_freq = full_model.model.rotary_emb.inv_freq.clone()
        state = {k: v.detach() for k, v in full_model.state_dict().items()}

        def part(name: str, dim: int | None) -> Any:
            t = state[name] if dim is None else state[name].chunk(world, dim=dim)[rank]
            return torch.nn.Parameter(t.contiguous().clone())

        self.vocab_lo = rank * (cfg.vocab_size // world)
        self.vocab_hi = self.vocab_lo + cfg.vocab_size // world
        self.embed = part("model.embed_tokens.weight", 0)
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append({
                "ln1": part(p + "input_layernorm.weight", None),
                "ln2": part(p + "post_attention_layernorm.weight", None),
                **{k: part(p + f"self_attn.{k}_proj.weight", 0) for k in "qkv"},
                "o": part(p + "self_attn.o_proj.weight", 1),
                **{k: part(p + f"mlp.{k}_proj.weight", 0) for k in ("gate", "up")},
                "down": part(p + "mlp.down_proj.weight", 1),
            })
        self.norm = part("model.norm.weight", None)
        self.lm_head = part("lm_head.weight", 0)
        self._ops = {grad: _collective_functions(grad) for grad in (False, True)}

    def parameters(self) -> list[Any]:
        layer_params = [t for layer in self.layers for t in layer.values()]
        return [self.embed, *layer_params, self.norm, self.lm_head]

    def _rms(self, x: Any, w: Any) -> Any:
        import torch

        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + self.eps))

    def _rope(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        """cos/sin in float32 on the weights' device, cast to the activations' dtype (as
        transformers' rotary embedding returns them)."""
        import torch

        positions = torch.arange(seq, dtype=torch.float32, device=self.inv_freq.device)
        freqs = positions[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None].to(dtype), emb.sin()[None, None].to(dtype)

    @staticmethod
    def _rotate(x: Any, cos: Any, sin: Any) -> Any:
        import torch

        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _attention(self, x: Any, layer: dict[str, Any], cos: Any, sin: Any) -> Any:
        import torch.nn.functional as F

        b, s, _ = x.shape
        q, k, v = (F.linear(x, layer[n]).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for n in "qkv")
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.head_dim**-0.5,
                                             enable_gqa=q.shape[1] != k.shape[1])
        out = F.linear(out.transpose(1, 2).reshape(b, s, -1), layer["o"])
        return self.leave(out, self.group)

    def forward(self, ids: Any) -> Any:
        import torch
        import torch.nn.functional as F

        self.enter, self.leave, self.gather = self._ops[torch.is_grad_enabled()]
        outside = (ids < self.vocab_lo) | (ids >= self.vocab_hi)
        h = F.embedding((ids - self.vocab_lo).masked_fill(outside, 0), self.embed)
        h = self.leave(h.masked_fill(outside[..., None], 0.0), self.group)
        cos, sin = self._rope(ids.shape[1], h.dtype)
        for layer in self.layers:
            x = self.enter(self._rms(h, layer["ln1"]), self.group)
            h = h + self._attention(x, layer, cos, sin)
            x = self.enter(self._rms(h, layer["ln2"]), self.group)
            mlp = F.linear(F.silu(F.linear(x, layer["gate"])) * F.linear(x, layer["up"]),
                           layer["down"])
            h = h + self.leave(mlp, self.group)
        x = self.enter(self._rms(h, self.norm), self.group)
        return self.gather(F.linear(x, self.lm_head), self.group)
