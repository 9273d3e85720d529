"""The forwards compute on local tensors while the parameters stay DTensors.

The generated forwards and the lowered collectives work on plain local shards (no DTensor
dispatch per op: the runtime's speed). The parameters are DTensors
(:func:`hpcodegen.runtime.shards.as_local_param`) so that torch's tools see the unsharded
model. The bridge: for the duration of a module's forward, each of its DTensor parameters
is replaced in ``module._parameters`` by its local view (``param.to_local()``: the same
storage), and put back when the forward returns or raises.

The view of a parameter the runtime made (one with a recorded spec) is its *local alias*: a
leaf tensor sharing the local shard's storage, made once per shard (:func:`_alias`). Autograd
accumulates every use's gradient into the alias's plain ``.grad``, so a backward does no DTensor
dispatch per parameter (``to_local``'s backward wrapped each gradient in a DTensor, then
accumulated DTensors: about half the backward's overhead). The alias's hooks keep the DTensor
parameter the one users see: before accumulation its ``.grad`` is taken from the parameter's
(``None`` after ``zero_grad``, a DTensor's local shard otherwise) and the parameter's own
gradient hooks run on the local gradient (:func:`hpcodegen.runtime.param_hooks.on_local`
hooks directly, any other on a DTensor); after accumulation the parameter's ``.grad`` is a
DTensor over the alias's ``.grad`` (same storage: in-place changes through either are seen by
both) and the parameter's post-accumulate hooks run. Other parameters (FSDP2's, a frozen one)
use ``to_local()``: autograd then accumulates into the DTensor ``.grad`` itself.

The swap is read at call time, so it follows whatever tensor the module holds then: FSDP2's
unsharded parameter under ``fully_shard`` (set by FSDP's pre-forward, which runs first), a
parameter a boundary scaled or hid (they run inside the forward, on the local view), or one
a ``module.to(...)`` swapped. A module called again inside its own forward keeps its views.

A forward may also read a child's parameter without calling the child (a short
convolution's ``F.conv1d(x, self.conv1d.weight)``), so each module's forward (the root's
excepted) also swaps its direct children's parameters; a child then called inside finds its
views in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

_STACK = "_hp_local_views"
_HOOKED = "_hp_local_view_hooks"
_HOLDERS = "_hp_local_view_holders"
_SWAPPED = "_hp_local_view_of"
_HANDLES = "_hp_local_view_handles"


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


_ALIAS = "_hp_local_alias"
_SPEC = "_hp_shard_spec"  # hpcodegen.runtime.shards.remember's mark
_NO_ALIAS = "_hp_no_local_alias"


def _alias(param: Any) -> Any:
    """``param``'s local alias (module docstring), made when missing or when the parameter's
    shard changed (a ``module.to(...)`` swap); None for a parameter without one."""
    if not param.requires_grad or getattr(param, _SPEC, None) is None \
            or getattr(param, _NO_ALIAS, False):
        return None
    local = param._local_tensor
    made = getattr(param, _ALIAS, None)
    if made is not None and made[0] is local:
        return made[1]
    # a Parameter: code reading a swapped-in view by ``get_parameter`` (a deferred bias) works
    alias = nn.Parameter(local.detach(), requires_grad=True)
    alias.register_hook(_before_accumulate(param, alias))
    alias.register_post_accumulate_grad_hook(_after_accumulate(param))
    setattr(param, _ALIAS, (local, alias))
    return alias


def _before_accumulate(param: Any, alias: Any) -> Any:
    from torch.distributed.tensor import DTensor

    def hook(grad: Any) -> Any:
        for fn in tuple((getattr(param, "_backward_hooks", None) or {}).values()):
            local_fn = getattr(fn, "local_fn", None)
            if local_fn is not None:
                out = local_fn(grad)
            else:
                out = fn(DTensor(grad, param._spec, requires_grad=False))
                out = out._local_tensor if isinstance(out, DTensor) else out
            grad = grad if out is None else out
        # after the parameter's hooks: one may clear .grad for this backward (grad buckets)
        held_grad = param.grad
        if held_grad is None:
            if alias.grad is not None:
                alias.grad = None
        elif held_grad._local_tensor is not alias.grad:
            alias.grad = held_grad._local_tensor
        return grad
    return hook


def _after_accumulate(param: Any) -> Any:
    from torch.distributed.tensor import DTensor

    def hook(alias: Any) -> None:
        grad = alias.grad
        held_grad = param.grad
        if held_grad is None or held_grad._local_tensor is not grad:
            param.grad = DTensor(grad, param._spec, requires_grad=False)
        for fn in tuple((getattr(param, "_post_accumulate_grad_hooks", None) or {}).values()):
            fn(param)
    return hook


def without_aliases(params: Any) -> None:
    """Let ``params`` use ``to_local()`` views, so autograd differentiates the DTensor
    parameters themselves: for code that asks autograd for gradients with respect to the
    parameters it holds (a pipeline schedule's split backward, ``W`` steps), which an alias
    the parameter never enters the graph through would leave without one."""
    for param in params:
        setattr(param, _NO_ALIAS, True)
        if hasattr(param, _ALIAS):
            delattr(param, _ALIAS)


def _view(value: Any) -> Any:
    alias = _alias(value)
    return value.to_local() if alias is None else alias


def _to_local(module: nn.Module, _args: Any) -> None:
    # attributes set at install, read as attributes and mutated in place: no __dict__
    # writes in a forward (torch.compile breaks the graph on those)
    saved = []
    for holder in getattr(module, _HOLDERS):
        for name, value in holder._parameters.items():
            if _is_dtensor(value):
                saved.append((holder, name, value))
    for holder, name, value in saved:
        holder._parameters[name] = _view(value)
        getattr(holder, _SWAPPED)[name] = value
    getattr(module, _STACK).append(saved)


def _restore(module: nn.Module, _args: Any, _output: Any) -> None:
    stack = getattr(module, _STACK)
    if not stack:
        return
    for holder, name, value in reversed(stack.pop()):
        holder._parameters[name] = value
        getattr(holder, _SWAPPED).pop(name, None)


def held(module: nn.Module, name: str) -> Any:
    """``module``'s parameter ``name`` as the forward's caller set it: the DTensor (or
    FSDP2's unsharded parameter) whose view a parent's forward swapped in, else the
    attribute itself. For pre-hooks that hook the tensor a forward really uses."""
    swapped = getattr(module, _SWAPPED, None)
    if swapped and name in swapped:
        return swapped[name]
    return getattr(module, name)


def local_view(value: Any) -> Any:
    """A DTensor's local view (differentiable), anything else unchanged: for runtime code
    that reads a parameter of another module than the one running (a deferred bias)."""
    return _view(value) if _is_dtensor(value) else value


def local_shape(value: Any) -> tuple[int, ...]:
    """The shape of this rank's part: a DTensor's local shape, any tensor's own shape (for
    install-time code sizing a compute by the local parameter)."""
    return tuple(value._local_tensor.shape if _is_dtensor(value) else value.shape)


def _owns_dtensor(module: nn.Module) -> bool:
    return any(_is_dtensor(p) for p in module._parameters.values())


def install_local_views(model: nn.Module) -> int:
    """Hook every module owning a DTensor parameter or parenting one that does (module
    docstring); the count."""
    count = 0
    for module in model.modules():
        # not the root's children: its hooks run at a compiled forward's edge (a graph break)
        kids = () if module is model else tuple(module.children())
        holders = [m for m in (module, *kids) if _owns_dtensor(m)]
        if module.__dict__.get(_HOOKED) or not holders:
            continue
        module.__dict__[_HOLDERS] = holders
        module.__dict__[_STACK] = []
        for holder in holders:
            holder.__dict__.setdefault(_SWAPPED, {})
        module.__dict__[_HANDLES] = (module.register_forward_pre_hook(_to_local),
                                     module.register_forward_hook(_restore, always_call=True))
        module.__dict__[_HOOKED] = True
        count += 1
    for param in model.parameters():  # now: a compiled forward finds them made
        if _is_dtensor(param):
            _alias(param)
    return count


def views_outside(root: nn.Module, call: Callable[..., Any],
                  name: str = "") -> Callable[..., Any]:
    """``call`` (``root``'s compiled forward) with the swap done around it, in eager Python.

    Inside a compiled region the hooks above are traced: dynamo guards every object they
    touch (the holders, the stacks, each DTensor parameter and its spec: about two thirds
    of a whole model's guards) and checks those guards on every call, and a hook that reads
    a DTensor parameter (to hook its gradient) makes it an input of the graph. So before
    ``call`` each DTensor parameter under ``root`` is swapped for its view (its local alias:
    a plain leaf, the graph's input, into which the compiled backward's gradient accumulates
    as in eager) and put back after it returns or raises; the view hooks and the gradient
    hooks' pre-hooks (:func:`~hpcodegen.runtime.param_hooks.install_use_hook`) of the
    modules whose parameters this covers leave the traced region, the latter run here after
    the swap. The compiled graph then sees plain tensors only. A module with a parameter
    that has no alias when compiled (FSDP2's, a frozen one) keeps its hooks, read inside
    the forward as before.

    The swap runs on every call, outside dynamo's guards, so it is kept to identity checks
    (:class:`_Slots`): each slot's parameter, shard and alias are recorded here once. A
    parameter replaced afterwards by one hpcodegen made (a ``module.to(...)``, a load) is
    re-read; one replaced by a DTensor hpcodegen did not make (FSDP2's ``fully_shard``
    applied after compiling, whose sharded parameter is not this rank's tp shard) is refused
    with a :class:`~hpcodegen.errors.PlanError` naming the module.

    Args:
        name: ``root``'s FQN in the model, for that error (``""``: the model itself).

    Returns:
        the wrapped callable, to set as ``root._compiled_call_impl``.
    """
    from torch.distributed.tensor import DTensor

    from hpcodegen.runtime.param_hooks import take_use_hooks

    slots = _Slots(root, name)
    covered = {(id(holder), key) for holder, key in slots.holders()}

    def all_covered(*modules: nn.Module) -> bool:
        return all((id(m), key) in covered for m in modules
                   for key, value in m._parameters.items() if isinstance(value, DTensor))

    use_hooks = [(module, hook) for module in root.modules() if all_covered(module)
                 for hook in take_use_hooks(module)]
    for module in root.modules():
        handles = module.__dict__.get(_HANDLES)
        if handles is not None and all_covered(*module.__dict__[_HOLDERS]):
            for handle in handles:
                handle.remove()
            del module.__dict__[_HANDLES]

    def swapped_call(*args: Any, **kwargs: Any) -> Any:
        swapped = slots.swap_in()
        try:
            for module, hook in use_hooks:
                hook(module, ())
            return call(*args, **kwargs)
        finally:
            for params, key, param, swapped_of in swapped:
                params[key] = param
                swapped_of.pop(key, None)
    return swapped_call


class _Slots:
    """The DTensor parameters one compiled call swaps, recorded once (:func:`views_outside`).

    A slot is a list ``[params, key, param, made, swapped_of, fqn]``: the holder's
    ``_parameters`` dict and the key, the DTensor parameter, the ``(shard, alias)`` pair
    :func:`_alias` recorded on it, the holder's :func:`held` record, the parameter's FQN.
    On a call, a slot whose dict still holds ``param``, whose pair is still the recorded one
    over the same shard and which still requires grad takes the alias straight away (four
    identity tests, no attribute walk); any other goes through :meth:`_resolve`.
    """

    def __init__(self, root: nn.Module, name: str) -> None:
        from torch.distributed.tensor import DTensor

        self.root, self.name = root, name
        self.slots: list[list[Any]] = []
        for prefix, holder in root.named_modules():
            for key, value in holder._parameters.items():
                if isinstance(value, DTensor) and _alias(value) is not None:
                    self.slots.append([holder._parameters, key, value, getattr(value, _ALIAS),
                                       holder.__dict__.setdefault(_SWAPPED, {}),
                                       f"{prefix}.{key}".lstrip("."), holder])

    def holders(self) -> list[tuple[nn.Module, str]]:
        """``(holder module, parameter name)`` of every slot."""
        return [(slot[6], slot[1]) for slot in self.slots]

    def swap_in(self) -> list[tuple[Any, str, Any, dict[str, Any]]]:
        """Put each slot's view in place; what to put back, as ``(params, key, param,
        swapped_of)``."""
        swapped = []
        for slot in self.slots:
            params, key, param, made, swapped_of, _fqn, _holder = slot
            if params[key] is param and param.requires_grad \
                    and getattr(param, _ALIAS, None) is made \
                    and made[0] is param._local_tensor:
                params[key] = made[1]
            else:
                param = self._resolve(slot, params[key])
                if param is None:
                    continue
            swapped_of[key] = param
            swapped.append((params, key, param, swapped_of))
        return swapped

    def _resolve(self, slot: list[Any], value: Any) -> Any:
        """The slow path of :meth:`swap_in` for one slot: swap ``value``'s view in and
        return ``value`` (the slot re-recorded when it has an alias), None when ``value`` is
        no DTensor (a parent's hook swapped it already); refuse a DTensor hpcodegen did not
        make."""
        from torch.distributed.tensor import DTensor

        if not isinstance(value, DTensor):
            return None
        if getattr(value, _SPEC, None) is None:
            self._refuse(slot[5])
        params, key = slot[0], slot[1]
        params[key] = _view(value)
        made = getattr(value, _ALIAS, None)
        if made is not None and made[1] is params[key]:
            slot[2], slot[3] = value, made
        return value

    def _refuse(self, fqn: str) -> None:
        from hpcodegen.errors import PlanError, error

        where = f"{self.name}.{fqn}".lstrip(".")
        module = self.name or type(self.root).__name__
        raise PlanError([error(
            "runtime.sharded_after_compile", where,
            f"parameter {where} of module {module!r} was replaced after compile_parallelized "
            "by a DTensor hpcodegen did not make (FSDP2's fully_shard applied after "
            "compiling?): the compiled call would compute on a wrong shard",
            expected="fully_shard applied before compile_parallelized",
            hint="apply fully_shard (FSDP2) first, then compile_parallelized; see "
                 "docs/own-loop.md \"torch.compile\"")])
