"""Which host patches which part of a model, and which weights no site reaches.

Matching: hosts are tried most specific first (:func:`oretrofit._surgery.host.registered_hosts`). A
matching host takes the subtrees it ``owned`` (default ``[""]``, the whole model) that no more
specific host took; the fallback (the least specific host, ``torch.nn``) takes every module
outside them, its sites named by their module paths. A model no host but the fallback matches
is the fallback's alone.

Coverage: a part whose sites all state their ``scope`` is checked at the mechanism: every
parameter and buffer inside the part must lie in some site's scope (a module the site gates).
Whatever does not is *uncovered*, reported as its outermost module ``"path (ClassName)"``, or
as ``"path.attr (parameter of ClassName)"`` for a weight held directly by a module that is
otherwise reached. A token-local weight no site gates (an MLP, a bias, a position table) would
give a null token a non-zero state, so it must never pass silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Sequence

from torch import nn

from .host import Host, RetrofitError, Site, inside, join_path, registered_hosts

__all__ = ["Part", "compose", "unreached", "uncovered_error"]


@dataclass
class Part:
    """The share of one host in a plan: its sites and what it leaves uncovered."""

    host: Host
    sites: list[Site] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)


def _overlaps(path: str, roots: Sequence[str]) -> bool:
    return inside(path, roots) or any(inside(r, [path]) for r in roots)


def unreached(model: nn.Module, reached: Sequence[str], within: Sequence[str] = ("",)
              ) -> list[str]:
    """Weights (parameters, buffers) inside ``within`` that no path in ``reached`` contains.

    Reported as the outermost module whose weights are all unreached, ``"path (ClassName)"``
    (``root`` for the model itself), or as ``"path.attr (parameter of ClassName)"`` when the
    module holding the weight directly is otherwise reached.
    """
    state: dict[str, set[bool]] = {}     # module path -> reached flags of the weights below it
    for weight, _ in chain(model.named_parameters(), model.named_buffers()):
        flag, parts = inside(weight, reached), weight.split(".")
        for depth in range(len(parts)):
            state.setdefault(".".join(parts[:depth]), set()).add(flag)
    found: list[str] = []
    entries: list[str] = []
    for path, module in model.named_modules():
        if not inside(path, within) or inside(path, found) or path not in state:
            continue
        cls = type(module).__name__
        if state[path] == {False}:
            found.append(path)
            entries.append(f"{path or 'root'} ({cls})")
            continue
        for kind, named in (("parameter", module.named_parameters(recurse=False)),
                            ("buffer", module.named_buffers(recurse=False))):
            entries += [f"{join_path(path, n)} ({kind} of {cls})" for n, _ in named
                        if not inside(join_path(path, n), reached)]
    return entries


def _scoped_gaps(model: nn.Module, sites: list[Site], within: Sequence[str],
                 elsewhere: Sequence[str] = ()) -> list[str]:
    """:func:`unreached` over the sites' scopes, when every site states one (else [])."""
    if any(s.scope is None for s in sites):
        return []
    scopes = [p for s in sites for p in s.scope]
    return unreached(model, [*scopes, *elsewhere], within)


def _host_part(model: nn.Module, host: Host, paths: list[str]) -> Part:
    sites = host.sites(model)
    own = list(host.uncovered(model)) if hasattr(host, "uncovered") else []
    return Part(host, sites, own + _scoped_gaps(model, sites, paths))


def _fallback_part(model: nn.Module, host: Host, taken: list[str]) -> Part:
    """The fallback's sites outside the ``taken`` subtrees, and the weights none reaches."""
    sites = [s for s in host.sites(model)
             if s.scope is not None and not any(_overlaps(p, taken) for p in s.scope)]
    gaps = unreached(model, [p for s in sites for p in s.scope] + taken)
    return Part(host, sites, gaps)


def compose(model: nn.Module) -> list[Part]:
    """The hosts that patch ``model``, most specific first, each with its sites (see module
    docstring); raises :class:`RetrofitError` when no host matches."""
    hosts = registered_hosts()
    fallback = hosts[-1] if hosts else None
    taken: list[tuple[Host, list[str]]] = []
    for host in hosts[:-1]:
        if not host.matches(model):
            continue
        claimed = [p for _, paths in taken for p in paths]
        owned = list(host.owned(model)) if hasattr(host, "owned") else [""]
        free = [p for p in owned if not _overlaps(p, claimed)]
        if free:
            taken.append((host, free))
        if "" in free:
            break
    if not taken:
        if fallback is None or not fallback.matches(model):
            raise _no_host_error(model, hosts)
        taken.append((fallback, [""]))
    claimed = [p for _, paths in taken for p in paths]
    rest = [] if "" in claimed else [fallback]
    for host in [h for h, _ in taken] + rest:
        host.check(model)                          # before any host lists its sites
    parts = [_host_part(model, host, paths) for host, paths in taken]
    if rest:
        leftover = _fallback_part(model, fallback, claimed)
        if leftover.sites or leftover.uncovered:
            parts.append(leftover)
    names = [s.name for part in parts for s in part.sites]
    if len(set(names)) != len(names):
        raise RetrofitError(f"hosts {', '.join(p.host.name for p in parts)} name the same site "
                            "twice; give one host a more specific `owned`")
    return parts


def _no_host_error(model: nn.Module, hosts: list[Host]) -> RetrofitError:
    names = "; ".join(f"{h.name} ({h.supports})" if getattr(h, "supports", None) else h.name
                      for h in hosts) or "none"
    fallback = hosts[-1].name if hosts else "none"
    return RetrofitError(
        f"no registered host matches {type(model).__name__}: no host recognises its class, and "
        f"the fallback host {fallback!r} found no attention module it has a site for. "
        f"Registered hosts, most specific first: {names}. Register a site for your own module "
        "type with oretrofit.register_module_site(MyAttention, 'attention', apply) (apply(module, "
        "config) -> undo, usually set_site with an O-mixin), or a whole host with "
        "oretrofit.register_host(...)")


def uncovered_error(model: nn.Module, parts: list[Part]) -> RetrofitError:
    """The refusal of a model whose parts no site reaches (each named, with why and the fix)."""
    listed = [f"{entry} [host {p.host.name}]" for p in parts for entry in p.uncovered]
    more = f" … ({len(listed) - 8} more)" if len(listed) > 8 else ""
    return RetrofitError(
        f"{type(model).__name__} is only partly covered: no site of any host reaches "
        f"{', '.join(listed[:8])}{more}. Their weights would act on every token ungated, so a "
        "null (zero) token would no longer stay inert. Register a site for each such module type "
        "with oretrofit.register_module_site(ModuleType, kind, apply) (kind: attention, norm, "
        "ffn or inject), or pass allow_partial=True to patch the rest and record them under "
        "spec()['uncovered']")
