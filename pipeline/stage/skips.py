"""Which tensors between stages carry no gradient, so that training can pass them to several later stages.

torch's traced pipeline frontend (``_PipelineStage``) marks every floating tensor a stage sends or receives
as requiring a gradient, and refuses a tensor that requires one and goes to more than one later stage
("Backward of skip connections not supported yet"). A Llama computes its rotary cos/sin once, before its
first layer, and every later stage's layers read them: at 3 stages or more every training plan with layers
past stage 1 was refused, though no gradient flows into those tensors (they come from a buffer and the
positions). Here the split graph is walked once, stage by stage, to find the tensors that depend on no
parameter and on no tensor that does; each built stage is then told so (``free_of_grad``), on both sides of
the send, so that their sends and receives of gradients still match.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import fx

__all__ = ["free_of_grad", "grad_needs"]


def _floating(node: fx.Node) -> bool:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.is_floating_point()
    if isinstance(val, (tuple, list)):
        return any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in val)
    return True  # unknown: assume it may carry a gradient


def _outputs(gm: Any, inputs: list[bool]) -> list[bool]:
    """For each output of a stage's graph (flattened as torch's stage flattens it), whether it may carry a
    gradient, given whether each of its placeholders may; a nested graph module is walked the same way."""
    import operator

    from torch.distributed.pipelining._utils import flatten_args

    trained = {n for n, p in gm.named_parameters() if p.requires_grad}
    need: dict[fx.Node, bool | list[bool]] = {}

    def of(a: fx.Node) -> bool:
        got = need.get(a, True)
        return any(got) if isinstance(got, list) else got

    k = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            need[node] = inputs[k] if k < len(inputs) else True
            k += 1
        elif node.op == "get_attr":
            need[node] = str(node.target) in trained
        elif node.op == "output":
            return [of(o) if isinstance(o, fx.Node) else False for o in flatten_args(node.args)]
        elif node.op == "call_module" and isinstance(getattr(sub := gm.get_submodule(str(node.target)), "graph", None),
                                                     fx.Graph):  # a nested graph (torch.export's InterpreterModule)
            need[node] = _outputs(sub, [of(a) if isinstance(a, fx.Node) else False for a in node.args])
        elif node.op == "call_function" and node.target is operator.getitem and isinstance(need.get(node.args[0]), list):
            got = need[node.args[0]]
            idx = node.args[1]
            assert isinstance(got, list)
            need[node] = (got[idx] if isinstance(idx, int) and idx < len(got) else any(got)) and _floating(node)
        else:
            own = node.op == "call_module" and any(p.requires_grad for p in gm.get_submodule(str(node.target)).parameters())
            need[node] = (own or any(of(a) for a in node.all_input_nodes)) and _floating(node)
    return []


def grad_needs(split_gm: fx.GraphModule) -> dict[str, tuple[list[bool], list[bool]]]:
    """Per stage submodule name: whether each of its inputs and each of its outputs may carry a gradient."""
    import operator

    outs: dict[str, list[bool]] = {}
    found: dict[str, tuple[list[bool], list[bool]]] = {}

    def arg_needs(a: Any) -> bool:
        if not isinstance(a, fx.Node) or a.op == "placeholder":
            return False  # the model's own inputs are leaves: no gradient flows back into them
        if a.op == "call_function" and a.target is operator.getitem:
            src, idx = a.args[0], a.args[1]
            got = outs.get(getattr(src, "target", ""), [])
            return got[idx] if isinstance(idx, int) and idx < len(got) else True
        if a.op == "call_module":
            got = outs.get(str(a.target), [])
            return got[0] if got else True
        return True

    for node in split_gm.graph.nodes:
        if node.op != "call_module":
            continue
        sub = getattr(split_gm, str(node.target))
        ins = [arg_needs(a) for a in node.args]
        outs[str(node.target)] = _outputs(sub, ins) if isinstance(getattr(sub, "graph", None), fx.Graph) else []
        found[str(node.target)] = (ins, outs[str(node.target)])
    return found


def free_of_grad(stage: Any, inputs: list[bool], outputs: list[bool]) -> None:
    """Tell a built stage which of the tensors it receives (``inputs``) and sends (``outputs``) carry no
    gradient, where torch's frontend would assume they all do."""
    from torch.distributed.pipelining.stage import _RecvInfo

    if all(inputs) and all(outputs):
        return
    recv, send = stage._create_act_recv_info, stage._create_act_send_info

    def recv_info() -> tuple[Any, ...]:
        infos = []
        for k, info in enumerate(recv()):
            if k < len(inputs) and not inputs[k] and not info.is_root_arg and info.tensor_meta is not None \
                    and info.tensor_meta.requires_grad:
                buf = info.buffer.detach() if info.buffer is not None else None
                info = _RecvInfo(info.input_name, info.source, buf,
                                 dataclasses.replace(info.tensor_meta, requires_grad=False))
            infos.append(info)
        return tuple(infos)

    def send_info() -> Any:
        got = send()
        metas = list(stage._stage_meta.outputs or ())
        for k, m in enumerate(metas):
            if k < len(outputs) and not outputs[k] and m is not None and m.requires_grad:
                metas[k] = dataclasses.replace(m, requires_grad=False)
        stage._stage_meta.outputs = tuple(metas)
        return got

    stage._create_act_recv_info = recv_info
    stage._create_act_send_info = send_info
