"""The residual stream entering a layer's MLP branch, read from what the layer does when it runs
(the layout row "MLP branch, stream traced" of :mod:`.layouts`).

OFFN (eq. 15) gates the branch by ρτ(h), h the residual stream the branch reads and its output
is added to. Module names do not say which tensor that is (DINOv2's ``norm2``, Wav2Vec2's
``layer_norm``, Apertus' ``feedforward_layernorm`` and OLMo2's ``post_attention_layernorm``, a
norm of the attention *output*, all look alike), so it is read from the tensors the layer passes
at each call, by identity:

* the MLP reads a norm's output, and the layer's attention reads a norm's output too (or the
  ``nn.Identity`` standing in for one: ModernBERT's first layer) (pre-norm): the stream is that
  norm's input; it is the layer's own input where the attention and the MLP read it side by
  side (parallel residual: GPT-J, Phi, GPT-NeoX, Falcon);
* the MLP reads a norm's output and the attention reads the layer input as it came (post-norm:
  Wav2Vec2, HuBERT, OpenAI-GPT): the norm normalises the sums, its output is the stream, which
  the MLP reads;
* the MLP reads no norm's output (OLMo2's norms act on the branches' outputs): it reads the
  stream itself.

This is decided before the branch runs, as its gate needs it, and checked by the first call
that makes the decision: over that call a :class:`~torch.overrides.TorchFunctionMode` notes the
summands of every sum of the stream's shape (Cohere adds ``residual + attention + mlp``), follows
every tensor computed from the branch's output (dropout, layer scale) and records what it is
added to; the stream must be among those summands, or the call is refused with a
:class:`RetrofitError` naming the branch (and so is a later call that decides otherwise).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from ..._surgery.host import RetrofitError
from ..._surgery.patching import SiteConfig, Undo
from ..._surgery.per_call import PerCall, PerCallState
from ..._operators.presence_memo import carrier_presence
from ..torch_nn import patch_all
from .layouts import is_norm_named, is_qk_norm
from .capture import carrier_of
from .gates import gate_branch_output

__all__ = ["gate_traced_branch"]

_ADDS = frozenset({torch.add, Tensor.add, Tensor.add_, Tensor.__add__, Tensor.__radd__,
                   Tensor.__iadd__})
_SCALES = frozenset({torch.mul, Tensor.mul, Tensor.mul_, Tensor.__mul__, Tensor.__rmul__,
                     Tensor.__imul__})


def _tensors(tree: Any) -> list[Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, Tensor)]


class _Sums(TorchFunctionMode):
    """Over one layer call: the summands of each sum of the stream's ``shape`` it computes, the
    sum itself included (through scaling by a parameter or a number: Doge's
    ``input_residual * residual``), and, once :meth:`seed` names the branch's output, the
    summands of every tensor that a tensor computed from it is added to. Only tensors of the
    stream's shape are followed (and kept alive): not the attention's scores."""

    def __init__(self, shape: torch.Size) -> None:
        super().__init__()
        self.shape = shape
        self.kept: dict[int, Tensor] = {}     # every tensor an id below names, kept alive
        self.terms: dict[int, frozenset[int]] = {}
        self.derived: set[int] = set()
        self.addends: list[frozenset[int]] = []

    def seed(self, tensors: list[Tensor]) -> None:
        self.derived.update(self._keep(t) for t in tensors)

    def _keep(self, t: Tensor) -> int:
        self.kept[id(t)] = t
        return id(t)

    def summands(self, t: Tensor) -> frozenset[int]:
        return self.terms.get(id(t), frozenset({id(t)}))

    def _follow(self, func: Callable, inputs: list[Tensor], out: Tensor) -> None:
        """Note ``out``'s summands: a sum's, or, scaled, its one activation's."""
        if func in _ADDS and len(inputs) == 2:
            for t in (*inputs, out):
                self._keep(t)
            self.terms[id(out)] = frozenset({id(out)}).union(*map(self.summands, inputs))
        elif func in _SCALES:
            scaled = [t for t in inputs if not isinstance(t, nn.Parameter)]
            if len(scaled) == 1:
                self._keep(scaled[0])
                self.terms[self._keep(out)] = self.summands(scaled[0])

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        if any(id(t) in self.derived for t in inputs):
            if func in _ADDS:
                self.addends += [self.summands(t) for t in inputs if id(t) not in self.derived]
            self.derived.update(self._keep(t) for t in _tensors(out))
        elif isinstance(out, Tensor) and out.shape == self.shape:
            self._follow(func, inputs, out)
        return out


def _in_front(module: nn.Module, path: str) -> bool:
    """A module whose output a branch may read instead of the stream: a norm (a leaf, or one
    wrapping a norm, as AXK2's gated ``input_layernorm``), or the ``nn.Identity`` a layer holds
    where it leaves one out (ModernBERT's first ``attn_norm``)."""
    return ((is_norm_named(module) and not is_qk_norm(path))
            or isinstance(module, nn.Identity))


def _stream(branch_input: Tensor, attention_input: Tensor | None,
            calls: list[tuple[str, Tensor, Tensor]], layer_input: Tensor | None
            ) -> tuple[str, Tensor]:
    """``(how, stream)``: the stream entering the branch, by the rules of the module docstring;
    ``calls``: ``(path, input, output)`` of the layer's norm (or Identity) calls so far. Plain
    loops, not generators: every call of every layer runs this."""
    for path, x, y in reversed(calls):
        if y is branch_input:
            break
    else:
        return "its own input (no norm in front of it)", branch_input
    for _, _, y in calls:
        if y is attention_input:
            break
    else:
        return f"its own input, the output of {path} (post-norm)", branch_input
    if x is layer_input:
        return f"the layer input, the input of {path} (parallel residual)", x
    return f"the input of {path} (pre-norm)", x


@torch.compiler.assume_constant_result
def _confirmed(hooks: "_TracedGate") -> bool:
    """Whether a call has confirmed a decision (``hooks.checked``), read by a compiled call
    without a guard: the call after the first compiled one (which confirms it) would otherwise
    compile the same graph again, though checking the decision again computes the same."""
    return bool(hooks.checked)


class _TracedGate(PerCallState):
    """The hooks of :func:`gate_traced_branch` (a plain object's methods, so they pickle)."""

    layer_input = PerCall()
    attention_input = PerCall()
    stream = PerCall()
    p = PerCall()
    how = PerCall()
    trace = PerCall()
    calls = PerCall()

    def __init__(self, name: str, config: SiteConfig) -> None:
        self.name, self.config = name, config
        self.checked: frozenset[str] = frozenset()      # decisions a traced call has confirmed
        self._clear()

    def _clear(self) -> None:
        self.layer_input = self.attention_input = self.stream = self.p = self.how = None
        self.trace: _Sums | None = None
        self.calls: list[tuple[str, Tensor, Tensor]] = []

    def _refuse(self, why: str) -> RetrofitError:
        return RetrofitError(f"{self.name}: {why}, so the host cannot tell which residual stream "
                             "to gate this FFN branch by; register a layout naming it "
                             "(oretrofit.hosts.transformers.layouts.register_layout)")

    def enter_layer(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._clear()
        self.layer_input = carrier_of(args, kwargs)
        if not _confirmed(self):               # until a call has confirmed a decision
            self.trace = _Sums(self.layer_input.shape)
            self.trace.__enter__()

    def enter_attention(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.attention_input is None:
            self.attention_input = carrier_of(args, kwargs)

    def in_front(self, path: str, module: nn.Module, args: tuple, kwargs: dict,
                 output: Any) -> None:
        self.calls.append((path, carrier_of(args, kwargs), output))

    def enter_branch(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.how, self.stream = _stream(carrier_of(args, kwargs), self.attention_input,
                                        self.calls, self.layer_input)
        if self.trace is None and self.how not in self.checked:
            raise self._refuse(f"this call reads the stream as {self.how}, its first read it as "
                               f"{' or '.join(sorted(self.checked))}")
        self.p = carrier_presence(self.stream, self.config.tau, column=True)        # (B, N, 1)

    def leave_branch(self, module: nn.Module, args: tuple, output: Any) -> Any:
        gated = gate_branch_output(self.p, output, module)
        if self.trace is not None:
            self.trace.seed(_tensors(gated))
        return gated

    def leave_layer(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        trace, stream, how = self.trace, self.stream, self.how
        self._clear()
        if trace is None:
            return
        trace.__exit__(None, None, None)
        if output is None or how is None:          # the layer raised, or ran no branch
            return
        if not any(id(stream) in summands for summands in trace.addends):
            raise self._refuse(f"it read the stream entering this FFN branch as {how}, but the "
                               "layer adds the branch's output to other tensors")
        # a compiled call found ``checked`` empty (:func:`_confirmed`) and stores it unread: a read
        # would make Dynamo guard on it, and the next call compile the same graph again
        self.checked = (frozenset({how}) if torch.compiler.is_compiling()
                        else self.checked | {how})


# each layer's gate, kept across retrofits: a compiled call guards on the gate's identity (it reads
# the confirmation without a guard on its value, :func:`_confirmed`), so a new gate for a model
# retrofitted again would compile every graph again; the decision it confirmed is this layer's
_GATES: "weakref.WeakKeyDictionary[nn.Module, _TracedGate]" = weakref.WeakKeyDictionary()


def gate_traced_branch(name: str, layer: nn.Module, attention: nn.Module, branch: nn.Module,
                       config: SiteConfig) -> Undo:
    """OFFN gate (eq. 15) of the MLP ``branch`` (site ``name``) of ``layer``: ρτ(h)·branch(·),
    h the stream read from the layer's call (module docstring); ``attention`` is the layer's
    self-attention. A layer retrofitted again with the same site and config gets its gate back
    (:data:`_GATES`), and once the gate has confirmed its decision its exit hook is a plain one:
    no trace is left to end when the layer raises (the next call clears what the gate holds),
    and a compiled call guards on an always-called hook's id, which each retrofit renews."""
    hooks = _GATES.get(layer)
    if hooks is None or (hooks.name, hooks.config) != (name, config):
        hooks = _GATES[layer] = _TracedGate(name, config)
    always_call = not hooks.checked
    front = [(path, m) for path, m in layer.named_modules() if _in_front(m, path)]
    return patch_all(
        lambda: layer.register_forward_pre_hook(hooks.enter_layer, with_kwargs=True).remove,
        lambda: attention.register_forward_pre_hook(hooks.enter_attention,
                                                    with_kwargs=True).remove,
        *(lambda p=path, m=m: m.register_forward_hook(functools.partial(hooks.in_front, p),
                                                      with_kwargs=True).remove
          for path, m in front),
        lambda: branch.register_forward_pre_hook(hooks.enter_branch, with_kwargs=True).remove,
        lambda: branch.register_forward_hook(hooks.leave_branch).remove,
        lambda: layer.register_forward_hook(hooks.leave_layer, with_kwargs=True,
                                            always_call=always_call).remove)
