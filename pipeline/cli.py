"""Flags shared by every command that builds a model and a pipeline (``pipeline.run``, ``search.optimize``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import BACKENDS, DEVICES, MODES, OPTIMIZERS, SCHEDULES
from pipeline.core.sharding import MESH_ORDERS
from pipeline.core.spec import DTYPES, MIXED_PRECISIONS, ModelSpec
from pipeline.models.candidates import GRANULARITIES

DEFAULT_MODEL = "deit_small_patch16_224"


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (what was wrong, where to look), not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type of a count that has no meaning at 0 (threads, stages per rank): one line otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give a positive one, e.g. 2") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {value}): leave the flag out for "
                                         "the default")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None,
                   help=f"timm model name (default {DEFAULT_MODEL}) or hf:<transformers model type> (hf:gpt2, "
                   "hf:llama, hf:bert: built from its config, needs the [hf] extra); weights are random")
    g.add_argument("--model-factory", default=None, metavar="MODULE:FN",
                   help="your own model: my_pkg.models:build or path/to/file.py:build, a callable that returns "
                   "(model, example_batch); --model-kwargs are passed to it")
    g.add_argument("--model-kwargs", default=None, metavar="JSON",
                   help='timm.create_model overrides (\'{"depth": 4, "img_size": 64}\'), transformers config '
                   'settings (\'{"n_layer": 4, "n_embd": 128}\') or the factory\'s keyword arguments')
    g.add_argument("--image-size", type=int, default=None,
                   help="input height=width for models that take any size (CNNs); ViTs take img_size in --model-kwargs")
    g.add_argument("--seq-len", type=int, default=None, help="tokens per sample for hf: models (default 128)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="whole-batch size (default 32; a factory's: its example batch's)")
    g.add_argument("--dtype", default=None, choices=DTYPES, help="parameter and input dtype (default float32)")
    g.add_argument("--mixed-precision", default=None, choices=MIXED_PRECISIONS,
                   help="training in mixed precision: float32 weights computing in bfloat16 (FSDP2's "
                        "MixedPrecisionPolicy with --dp-shard, torch.autocast otherwise); checked against a "
                        "reference in the same precision")
    g.add_argument("--checkpoint", default=None, help="optional local state_dict to load (timing does not need one)")
    g.add_argument("--seed", type=int, default=None,
                   help="seed for weights and inputs, and for search.optimize's sampler (default 0)")
    g.add_argument("--granularity", default="block", choices=GRANULARITIES,
                   help="candidate cut points: 'block' (top-level and stacked blocks) or 'layer' (inside blocks)")


def add_runtime_args(p: argparse.ArgumentParser, *, search: bool = False) -> None:
    """The runtime flags; ``search`` makes --schedule and --stages-per-rank lists to search over."""
    g = p.add_argument_group("runtime")
    g.add_argument("--backend", default=None, choices=BACKENDS,
                   help="'torch' (torch.distributed.pipelining, default) or 'pippy' (torchpippy)")
    if search:
        g.add_argument("--schedule", default=None, metavar="NAMES",
                       help=f"schedules to search, comma-separated, or 'all' ({', '.join(SCHEDULES)}; default "
                       "GPipe): each is a layout of the space, with the chunk counts its rules allow")
        g.add_argument("--stages-per-rank", default=None, metavar="V,...",
                       help="virtual stages per rank to search for the multi-stage schedules, comma-separated "
                       "(default 2; GPipe and 1F1B always 1); --stages counts ranks, each holds V stages")
    else:
        g.add_argument("--schedule", default=None, choices=SCHEDULES, help="pipeline schedule (default GPipe)")
    g.add_argument("--device", default=None, choices=DEVICES, help="cpu (gloo, default) or cuda (NCCL, a GPU per stage)")
    g.add_argument("--threads-per-stage", type=positive_int, default=None,
                   help="intra-op threads per stage process (default: cores // stages, at least 1)")
    if not search:
        g.add_argument("--stages-per-rank", type=positive_int, default=None, metavar="V",
                       help="virtual stages per rank for the multi-stage schedules (Interleaved1F1B, LoopedBFS, "
                            "InterleavedZeroBubble: any V; ZBVZeroBubble, DualPipeV: 2, training only); "
                            "--stages counts ranks, so the model is cut into stages x V pieces")
    g.add_argument("--mode", default=None, choices=MODES,
                   help="'infer' (forward only, default) or 'train' (forward, loss, backward and an optimizer step; "
                        "loss and gradients are checked against the serial step)")
    g.add_argument("--optimizer", default=None, choices=OPTIMIZERS,
                   help="optimizer of a training step on every stage and the serial model (default adamw)")
    if search:
        g.add_argument("--recompute", default=None, metavar="search|none|full",
                       help="training: activation recomputation; 'search' (default) gives each plan the least "
                            "per-stage recomputation that fits --device-memory (none without a limit), 'none' or "
                            "'full' pin it for every plan")
    else:
        g.add_argument("--dp-shard", type=positive_int, default=None, metavar="D",
                       help="training: the pipeline inside sharded data parallel: stages x D processes on a (pp, "
                            "dp_shard) mesh, each stage fully_shard-ed (FSDP2) over its D replicas, each replica "
                            "running the pipeline on 1/D of the batch (default 1)")
        add_mesh_order_arg(g, "--dp-shard")
        g.add_argument("--recompute", default=None, metavar="none|full|N,...",
                       help="training: activation recomputation of the model's stacked blocks; 'none' (default), "
                            "'full' (every block), or per stage in stage order how many of its first blocks to "
                            "recompute, e.g. 2,1,0,0 (they keep their input, and run their forward again in backward)")


def add_mesh_order_arg(g: Any, with_flag: str) -> None:
    """``--mesh-order`` (``pipeline.core.sharding``), for the commands that run a mesh (``with_flag`` makes one)."""
    g.add_argument("--mesh-order", default=None, choices=MESH_ORDERS, metavar="pp,dp_shard|dp_shard,pp",
                   help=f"with {with_flag}: the mesh's dimensions, outermost first; 'pp,dp_shard' (default, "
                        "torchtitan's: a stage's replicas on consecutive ranks, so under torchrun --nnodes FSDP's "
                        "collectives stay within a node) or 'dp_shard,pp' (a replica's pipeline on consecutive ranks)")


MODEL_FLAGS = ("model", "model_factory", "model_kwargs", "image_size", "seq_len", "batch_size", "dtype", "checkpoint",
               "seed", "mixed_precision")


def parse_kwargs(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise PipesplitError(f"--model-kwargs is not valid JSON ({e.msg}): write it like '{{\"depth\": 4}}'") from None
    if not isinstance(value, dict):
        raise PipesplitError(f"--model-kwargs must be a JSON object, not {type(value).__name__}: e.g. '{{\"depth\": 4}}'")
    return value


@dataclass(frozen=True, kw_only=True)
class ModelArgs:
    """The model a command was asked for, before it is built (``resolve`` builds it once to read its input)."""

    name: str = DEFAULT_MODEL
    """A timm name or ``hf:<type>``."""
    factory: str | None = None
    """A factory's import path, in place of ``name``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    """None: 32, or a factory's example batch size."""
    image_size: int | None = None
    seq_len: int | None = None
    dtype: str = "float32"
    mixed_precision: str | None = None
    checkpoint: str | None = None
    seed: int = 0
    granularity: str = "block"
    """Candidate cut points: ``block`` or ``layer``."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelArgs:
        factory = getattr(args, "model_factory", None)
        if factory is not None and args.model is not None:
            raise PipesplitError(f"--model {args.model} and --model-factory {factory} both name a model: give one")
        return cls(name=factory or args.model or DEFAULT_MODEL, factory=factory, kwargs=parse_kwargs(args.model_kwargs),
                   batch_size=args.batch_size, image_size=args.image_size, seq_len=getattr(args, "seq_len", None),
                   dtype=args.dtype or "float32", mixed_precision=getattr(args, "mixed_precision", None),
                   checkpoint=args.checkpoint, seed=0 if args.seed is None else args.seed,
                   granularity=args.granularity)

    def resolve(self) -> ModelSpec:
        from pipeline.models.build import resolve_spec

        if self.mixed_precision is not None and self.dtype != "float32":  # before the model is built to find out
            ModelSpec(name=self.name, dtype=self.dtype, mixed_precision=self.mixed_precision)
        spec = resolve_spec(self.name, kwargs=self.kwargs, batch_size=self.batch_size, image_size=self.image_size,
                            dtype=self.dtype, checkpoint=self.checkpoint, seed=self.seed,
                            source="factory" if self.factory else None, seq_len=self.seq_len)
        return dataclasses.replace(spec, mixed_precision=self.mixed_precision) if self.mixed_precision else spec


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    """Build the ModelSpec the flags describe (this builds the model once to read its input size)."""
    return ModelArgs.from_args(args).resolve()
