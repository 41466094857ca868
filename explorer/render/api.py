"""`op_graph` and `module_graph`: the public diagram functions (graphviz.Digraph out)."""

from __future__ import annotations

from collections.abc import Iterable

import graphviz
from torch import nn

from ..analysis.forward_graph import ForwardGraph
from ..errors import DeferredInitError
from ..graph import InitGraph
from .diagram import Diagram
from .dot import to_digraph
from .forward_view import forward_layout
from .module_view import module_diagram
from .op_view import OpViewOptions, op_diagram
from .scene import Scene, graph_scene, module_scene

Drawable = nn.Module | InitGraph | BaseException | ForwardGraph
RANKDIRS = ("LR", "TB")


def _scene(subject: Drawable) -> Scene:
    if isinstance(subject, nn.Module):
        return module_scene(subject)
    if isinstance(subject, InitGraph):
        root = subject.root() if subject.finished and subject.root is not None else None
        return module_scene(root) if root is not None else graph_scene(subject)
    if isinstance(subject, BaseException):
        graph = subject.graph if isinstance(subject, DeferredInitError) else getattr(subject, "deferred_graph", None)
        if isinstance(graph, InitGraph):
            return graph_scene(graph, error=f"{type(subject).__name__}: {subject}")
        raise ValueError(
            f"op_graph: this {type(subject).__name__} carries no recorded graph "
            "(only errors raised by deferred_init do)"
        )
    raise TypeError(
        f"op_graph expects an nn.Module, an InitGraph or a deferred_init error, got {type(subject).__name__}"
    )


def op_layout(
    subject: Drawable,
    *,
    depth: int | None = None,
    focus: str | None = None,
    closure_of: str | None = None,
    max_nodes: int | None = 400,
    edge_labels: bool = True,
    fold_repeats: bool = True,
    legend: bool = True,
    unfold: Iterable[str] = (),
    outline: bool = False,
) -> Diagram:
    """What `op_graph` draws, as plain data (nodes with styles and clusters, edges): for tests and widgets."""
    options = OpViewOptions(
        depth, focus, closure_of, max_nodes, edge_labels, fold_repeats, legend, frozenset(unfold), outline=outline
    )
    if isinstance(subject, ForwardGraph):
        return forward_layout(subject, options)
    return op_diagram(_scene(subject), options)


def op_graph(
    subject: Drawable,
    *,
    depth: int | None = None,
    focus: str | None = None,
    closure_of: str | None = None,
    max_nodes: int | None = 400,
    edge_labels: bool = True,
    fold_repeats: bool = True,
    legend: bool = True,
    unfold: Iterable[str] = (),
    rankdir: str = "LR",
    outline: bool = False,
) -> graphviz.Digraph:
    """The recorded construction of `subject` as a diagram: ops and tensors, one cluster per module.

    `subject` is a module (deferred, partly materialized, or eager: tensors only, no ops), an
    `InitGraph`, or the error a failed `deferred_init` raised (its partial graph is drawn, ending
    in a "construction failed here" node). Op nodes are styled by `explorer.inspection.op_kind`
    (factory, random, in-place, view, compute, data, external-input); tensor nodes by state (fake,
    materialized, real). Edges carry the shape and dtype of the tensor that flows; a legend is added
    unless `legend=False`.

    - `depth`: modules deeper than this (root = 0) are collapsed into one summary node each (path,
      class, ops, tensors, bytes); identical collapsed siblings are drawn once as "Class ×N" unless
      `fold_repeats=False`; `unfold` names modules whose repeated children are drawn one by one
      (what clicking "Class ×N" asks for). The focused module is never collapsed.
    - `outline`: instead of a `depth`, the model's outline: the root (or focus), every container of
      numbered blocks and any module running most of its parent's ops are boxes; every other module
      is one node, repeated blocks one "Class ×N"; the ops an opened module runs outside its
      submodules (a rotary table, a causal mask) are one node in its box. Not with `depth`.
      `FORWARD_FIRST_VIEW` is what the Graph tab opens a forward on.
    - `rankdir`: "LR" (left to right, the default) or "TB" (top to bottom).
    - `focus`: a module path; draws that module's tensors, the ops in their closures, and the other
      named tensors those ops read.
    - `closure_of`: a tensor's qualified name (or "#<graph>:<tensor id>"); draws exactly the ops
      `InitGraph.closure_of` returns for it.
    - `subject` may also be an `explorer.forward_graph(...)`: the forward pass, drawn the same way
      (ops in the cluster of the module whose forward ran them, parameters and inputs as the nodes
      feeding them, FLOPs and activation bytes per module on clusters and collapsed modules; op
      nodes are `op:forward:<i>`); `closure_of` does not apply to it.
    - `max_nodes`: beyond this many nodes (chronological order), one "N more ops/tensors not shown"
      node stands for the rest; None draws everything.

    Node names follow `explorer.render.names` (`op:0:12`, `tensor:layers.0.weight`, `module:layers`).
    Raises ValueError for an unknown focus path or tensor name, or both given; TypeError for a
    subject of another type. `to_svg(op_graph(m))` needs the Graphviz `dot` program.
    """
    if rankdir not in RANKDIRS:
        raise ValueError(f"op_graph: rankdir must be one of {', '.join(RANKDIRS)}, got {rankdir!r}")
    diagram = op_layout(
        subject,
        depth=depth,
        focus=focus,
        closure_of=closure_of,
        max_nodes=max_nodes,
        edge_labels=edge_labels,
        fold_repeats=fold_repeats,
        legend=legend,
        unfold=unfold,
        outline=outline,
    )
    digraph = to_digraph(diagram, name="op_graph")
    digraph.graph_attr["rankdir"] = rankdir
    return digraph


def module_layout(
    module: nn.Module, *, depth: int | None = None, fold_repeats: bool = True, legend: bool = True
) -> Diagram:
    """What `module_graph` draws, as plain data."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module_graph expects an nn.Module, got {type(module).__name__}")
    return module_diagram(module, depth, fold_repeats, legend)


def module_graph(
    module: nn.Module, *, depth: int | None = None, fold_repeats: bool = True, legend: bool = True
) -> graphviz.Digraph:
    """The module tree of `module` as a diagram, one node `module:<path>` per module path.

    Each node shows the class, parameters, bytes (each storage once, as in `inspect(m).modules`) and
    state: fake, partly materialized (with the share), materialized, or real (eager). Modules
    deeper than `depth` (root = 0) are left out, their parent saying how many; identical sibling
    subtrees are drawn once as "Class ×N" unless `fold_repeats=False`.
    """
    return to_digraph(module_layout(module, depth=depth, fold_repeats=fold_repeats, legend=legend), name="module_graph")
