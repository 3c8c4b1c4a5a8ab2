"""torchtitan's, Megatron-Core's and DeepSpeed's split rules, computed by their own code on our cut points.

Each rule maps the model to the framework's notion of a layer (``pipeline.core.stack``), calls the function
the framework itself splits with, and maps the stages it returns back to cuts between our segments:

- torchtitan: ``torchtitan.distributed.pipeline_parallel._generate_llm_fqn_per_model_part(num_stages,
  num_layers, input_weight, output_weight)``, which ``pipeline_llm`` calls when its user gives no
  ``module_fqns_per_model_part``; weights 1 and 1 are ``ParallelismConfig``'s defaults
  (``pipeline_parallel_first_stage_less_layers`` / ``..._last_stage_less_layers``).
- Megatron-Core: ``megatron.core.transformer.transformer_block.get_num_layers_to_build(config, pp_rank=r)``
  on a ``TransformerConfig`` with ``pipeline_model_parallel_size`` and (``megatron-account``) both
  ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``; the embedding
  is built on the first stage and the output layer and loss on the last.
- DeepSpeed: ``deepspeed.runtime.utils.partition_balanced`` over each layer's parameters (what
  ``PipelineModule(partition_method="parameters")``, its default, does) and ``partition_uniform``
  (``"uniform"``), over the layers a ``PipelineModule`` of this model lists: each segment outside the stack,
  and each stacked layer.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.core.policies import Policy, PolicyInputs
from pipeline.core.stack import Stack, find_stack

__all__ = ["FRAMEWORKS", "PEERS", "PeerMissing", "deepspeed_parts", "framework_module"]

FRAMEWORKS = {"torchtitan": "torchtitan", "megatron": "megatron-core", "deepspeed": "deepspeed"}
"""Each framework and the distribution that installs it (``pip install 'pipesplit[peers]'``)."""


class PeerMissing(ValueError):
    """The framework whose rule was asked for is not installed here."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The frameworks log their accelerator and CUDA probes at import; a split rule should print nothing."""
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def framework_module(framework: str, module: str) -> Any:
    """``module`` of ``framework``, imported quietly, or a PeerMissing that says how to install it."""
    try:
        with _quiet():
            return importlib.import_module(module)
    except ImportError as e:
        raise PeerMissing(f"{framework}'s rule runs {framework}'s own code, which does not import here ({e}): "
                          f"pip install 'pipesplit[peers]' (or {FRAMEWORKS[framework]})") from None


def _stack(inputs: PolicyInputs) -> Stack:
    if not inputs.segment_names:
        raise ValueError("the frameworks' rules need the segments' module names")
    return find_stack(inputs.segment_names)


def _checked(stack: Stack, cuts: list[int], who: str) -> list[int]:
    if any(c <= 0 or c >= stack.segments for c in cuts) or cuts != sorted(set(cuts)):
        raise ValueError(f"{who} leaves a stage of this model empty (cuts at segments {cuts} of {stack.segments})")
    return cuts


def torchtitan_cuts(inputs: PolicyInputs, stages: int, input_weight: int = 1, output_weight: int = 1) -> list[int]:
    """torchtitan's ``_generate_llm_fqn_per_model_part``: each stage begins where its module list begins."""
    stack = _stack(inputs)
    pp = framework_module("torchtitan", "torchtitan.distributed.pipeline_parallel")
    parts = pp._generate_llm_fqn_per_model_part(stages, stack.layers, input_weight, output_weight)
    cuts = []
    for k, part in enumerate(parts[1:], 1):
        if not part:
            raise ValueError(f"torchtitan's rule leaves stage {k} of {stages} without a module")
        first = part[0]
        cuts.append(stack.layer_cut(int(first.split(".")[1])) if first.startswith("layers.") else stack.end)
    return _checked(stack, cuts, "torchtitan's rule")


def megatron_cuts(inputs: PolicyInputs, stages: int, account: bool = False) -> list[int]:
    """Megatron-Core's ``get_num_layers_to_build`` for each pipeline rank (even decoder layers; ``account``:
    the embedding and the loss counted as a layer each)."""
    stack = _stack(inputs)
    cfg_mod = framework_module("megatron", "megatron.core.transformer.transformer_config")
    block = framework_module("megatron", "megatron.core.transformer.transformer_block")
    # Megatron's config asks for the dtype sent between stages; torch is imported as the frameworks are (only when
    # a rule runs), so that the registry of names stays importable by the pure report
    torch = importlib.import_module("torch")

    try:
        with _quiet():
            cfg = cfg_mod.TransformerConfig(num_layers=stack.layers, hidden_size=64, num_attention_heads=4,
                                            pipeline_model_parallel_size=stages, pipeline_dtype=torch.float32,
                                            account_for_embedding_in_pipeline_split=account,
                                            account_for_loss_in_pipeline_split=account)
            counts = [block.get_num_layers_to_build(cfg, pp_rank=r) for r in range(stages)]
    except (AssertionError, ValueError) as e:
        raise ValueError(f"Megatron-Core refuses {stack.layers} layers on {stages} stages: {e}") from None
    cuts, at = [], 0
    for k, n in enumerate(counts[:-1]):
        at += n
        if counts[k + 1] == 0 and k + 1 < stages - 1:
            raise ValueError(f"Megatron-Core's rule leaves stage {k + 1} of {stages} without a layer")
        cuts.append(stack.layer_cut(at))
    return _checked(stack, cuts, "Megatron-Core's rule")


def deepspeed_parts(stack: Stack, elements: list[float], stages: int, method: str = "parameters") -> list[int]:
    """DeepSpeed's ``parts`` (stage boundaries over its layers) for ``method``, from its own partition code."""
    utils = framework_module("deepspeed", "deepspeed.runtime.utils")
    weights = stack.items(elements)
    if method == "uniform":
        return [int(p) for p in utils.partition_uniform(num_items=len(weights), num_parts=stages)]
    return [int(p) for p in utils.partition_balanced(weights=weights, num_parts=stages)]


def deepspeed_cuts(inputs: PolicyInputs, stages: int, method: str = "parameters") -> list[int]:
    """DeepSpeed's ``PipelineModule`` partition (``parameters``: ``partition_balanced`` over each layer's
    parameters; ``uniform``: ``partition_uniform`` over the layer count) mapped back to our segments."""
    stack = _stack(inputs)
    parts = deepspeed_parts(stack, [float(w) for w in inputs.segment_elements], stages, method)
    starts = [0, *stack.item_cuts()]
    if any(a >= b for a, b in zip(parts, parts[1:])):
        raise ValueError(f"DeepSpeed's {method} partition {parts} leaves a stage without a layer")
    return _checked(stack, [starts[p] for p in parts[1:-1]], f"DeepSpeed's {method} partition")


def _peer(name: str, framework: str, default: bool, summary: str,
          rule: Callable[[PolicyInputs, int], list[int]]) -> Policy:
    return Policy(name=name, summary=summary, on_units=False, needs_profile=False, rule=rule, framework=framework,
                  default_rule=default)


PEERS: dict[str, Policy] = {p.name: p for p in (
    _peer("torchtitan", "torchtitan", True, "torchtitan's default: layers spread evenly, the embedding and the norm + "
          "head counted as one layer each (_generate_llm_fqn_per_model_part)", lambda i, s: torchtitan_cuts(i, s)),
    _peer("torchtitan-w2", "torchtitan", False, "torchtitan with pipeline_parallel_first/last_stage_less_layers = 2 "
          "(the embedding and the head counted as two layers each)", lambda i, s: torchtitan_cuts(i, s, 2, 2)),
    _peer("megatron", "megatron", True, "Megatron-Core's default: --num-layers / PP decoder layers per stage, the "
          "embedding on the first, output layer and loss on the last", lambda i, s: megatron_cuts(i, s)),
    _peer("megatron-account", "megatron", False, "Megatron-Core with --account-for-embedding-in-pipeline-split and "
          "--account-for-loss-in-pipeline-split", lambda i, s: megatron_cuts(i, s, True)),
    _peer("deepspeed-parameters", "deepspeed", True, "DeepSpeed PipelineModule's default partition_method="
          "'parameters' (partition_balanced of each layer's parameters)", lambda i, s: deepspeed_cuts(i, s)),
    _peer("deepspeed-uniform", "deepspeed", False, "DeepSpeed PipelineModule partition_method='uniform' (the same "
          "number of layers per stage, partition_uniform)", lambda i, s: deepspeed_cuts(i, s, "uniform")),
)}
