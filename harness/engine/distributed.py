"""Multi-process learners: a thin wrapper over ``accelerate`` + DeepSpeed ZeRO.

The learner writes one training loop; this module decides what "prepare", "backward",
"step" and "gather the weights for sampling" mean in the current launch:

======================  ======================================================================
launch                  mode
======================  ======================================================================
one process             ``single``: plain torch (any ZeRO request is ignored: ZeRO with one
                        process only adds overhead)
torchrun, no ZeRO       ``ddp``: ``Accelerator`` + DistributedDataParallel (gloo on CPU)
torchrun + ZeRO 2 / 3   ``zero2`` / ``zero3``: ``Accelerator(deepspeed_plugin=...)`` with
                        ``harness/configs/deepspeed/zero{2,3}.json`` (or ``HARNESS_DEEPSPEED_CONFIG``)
======================  ======================================================================

The sweep launcher sets ``HARNESS_ZERO_STAGE`` / ``HARNESS_DEEPSPEED_CONFIG`` and starts a
run under ``torchrun`` when ``launcher.procs > 1``; :meth:`Distributed.from_env` reads them.

Learner usage::

    dist = Distributed.from_env(micro_batch_size=cfg.train.micro_batch_size,
                                max_grad_norm=cfg.train.max_grad_norm, dtype=cfg.model.dtype)
    policy, opt = dist.prepare(policy, torch.optim.AdamW(policy.parameters(), lr=...))
    critic, copt = dist.prepare(critic, critic_opt)           # PPO: a second trained model
    ref = dist.prepare_reference(ref_model)                  # frozen; sharded under ZeRO-3
    with dist.gathered(policy) as m:                         # full weights on every rank
        rollouts = sample(m, tok, dist.shard(prompts), ...)  # ranks may differ in lengths
    for i, mb in enumerate(micro_batches):                   # same count on every rank!
        with dist.accumulate(policy, last=i == len(micro_batches) - 1):
            loss = loss_fn(policy(**mb)) / len(micro_batches)   # the learner normalises
            dist.backward(policy, loss)
    grad_norm = dist.step(policy, opt)                       # clip + step + zero_grad
    stats = dist.mean({"loss": loss.item()})                 # averaged over ranks
    dist.save_state(ckpt_dir); dist.load_state(ckpt_dir)     # every rank calls these
    weights = dist.state_dict(policy)                        # full state dict on main

Conventions and caveats:

- The learner normalises losses itself (divide by the number of micro-batches, or by the
  token count of the whole batch): the DeepSpeed configs keep
  ``gradient_accumulation_steps = 1`` and :meth:`accumulate` marks the accumulation
  boundary by hand (``engine.set_gradient_accumulation_boundary``), so a step may have a
  variable number of micro-batches (e.g. online RFT's filter) without DeepSpeed rescaling.
  Gradients are averaged over ranks, so each rank's loss is its shard's mean.
- Under ZeRO-3 a forward pass is a collective (parameters are gathered layer by layer):
  every rank must run the same number of forward passes of a prepared model; pad the
  shard with :meth:`shard` ``(pad=True)``. Sampling, where lengths differ, goes through
  :meth:`gathered`: full parameters on every rank, ZeRO-3 hooks removed, so each rank
  generates independently (memory: one full copy of the weights per rank).
- A second prepared model (PPO's critic) gets its own engine; accelerate then warns that
  "a wrapped DeepSpeed engine reference is currently tied" to the Accelerator. Harmless
  here: :meth:`backward` and :meth:`step` talk to each engine directly, never through
  ``accelerator.backward``.
- ZeRO-3 and Hugging Face ``from_pretrained``: create the :class:`Distributed` *before*
  loading a large model, so transformers sees ZeRO-3 enabled and loads it already
  partitioned (``deepspeed.zero.Init``) instead of a full copy per rank.
- CPU: DeepSpeed runs on CPU with ``DS_ACCELERATOR=cpu`` over gloo (the first run compiles a
  shared-memory op into ``~/.cache/torch_extensions``, ~90 s). accelerate treats DeepSpeed
  as a GPU feature: ``Accelerator(cpu=True)`` silently drops the DeepSpeed plugin (plain
  DDP), so the Accelerator is created with ``cpu=False`` and, where accelerate then
  records a world of 1 process, the rank bookkeeping is corrected from
  ``torch.distributed`` (see :meth:`_fix_accelerate_ranks`).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from harness.foundation.base import flatten

__all__ = ["Distributed", "deepspeed_config", "full_state", "load_full_state", "DEEPSPEED_DIR", "ENV_ZERO_STAGE",
           "ENV_DEEPSPEED_CONFIG"]

DEEPSPEED_DIR = Path(__file__).resolve().parents[1] / "configs" / "deepspeed"
ENV_ZERO_STAGE = "HARNESS_ZERO_STAGE"
ENV_DEEPSPEED_CONFIG = "HARNESS_DEEPSPEED_CONFIG"


def _world() -> tuple[int, int, int]:
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def deepspeed_config(zero_stage: Optional[int] = None, path: str | os.PathLike | None = None, *,
                     micro_batch_size: int = 1, max_grad_norm: float = 1.0, dtype: str = "float32",
                     hidden_size: Optional[int] = None, cpu: bool = False) -> dict:
    """Load ``path`` (default ``harness/configs/deepspeed/zero{stage}.json``) and resolve every
    ``"auto"``: micro batch size, clipping (0 = off), bf16/fp16 from ``dtype``, ZeRO-3
    bucket sizes from ``hidden_size``. ``gradient_accumulation_steps`` is forced to 1 (see
    the module docstring). On CPU, ``overlap_comm`` is turned off (no CUDA streams)."""
    if path is None:
        if zero_stage not in (2, 3):
            raise ValueError(f"zero_stage must be 2 or 3 (or give a config path), got {zero_stage!r}")
        path = DEEPSPEED_DIR / f"zero{zero_stage}.json"
    cfg = json.loads(Path(path).read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}  # "_comment" keys
    zo = cfg.setdefault("zero_optimization", {})
    if zero_stage is not None:
        zo["stage"] = zero_stage
    cfg["train_micro_batch_size_per_gpu"] = micro_batch_size
    cfg["gradient_accumulation_steps"] = 1
    cfg.pop("train_batch_size", None)
    if cfg.get("gradient_clipping", "auto") == "auto":
        cfg["gradient_clipping"] = float(max_grad_norm)
    for key, want in (("bf16", dtype == "bfloat16"), ("fp16", dtype == "float16")):
        sec = cfg.setdefault(key, {})
        if sec.get("enabled", "auto") == "auto":
            sec["enabled"] = want
    h = hidden_size or 1024
    autos = {"reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h),
             "stage3_param_persistence_threshold": 10 * h}
    for k, v in autos.items():
        if zo.get(k) == "auto":
            zo[k] = v
    if cpu:
        zo["overlap_comm"] = False
    leftover = [k for k, v in flatten(cfg).items() if v == "auto"]
    if leftover:
        raise ValueError(f"DeepSpeed config {path}: cannot resolve 'auto' for {', '.join(leftover)}")
    return cfg


class Distributed:
    """One per process. See the module docstring for the learner-side protocol."""

    def __init__(self, zero_stage: Optional[int] = None, ds_config: str | os.PathLike | None = None, *,
                 micro_batch_size: int = 1, max_grad_norm: float = 1.0, dtype: str = "float32",
                 cpu: Optional[bool] = None):
        import torch

        self.rank, self.world_size, self.local_rank = _world()
        self.max_grad_norm = float(max_grad_norm)
        self.micro_batch_size = micro_batch_size
        self.dtype = dtype
        if cpu is None:
            cpu = not torch.cuda.is_available()
        self.cpu = cpu
        self.zero_stage = zero_stage if self.world_size > 1 else None
        if self.zero_stage is None and ds_config is not None and self.world_size > 1:
            self.zero_stage = int(json.loads(Path(ds_config).read_text()).get("zero_optimization", {})
                                  .get("stage", 2))
        self._ds_path = ds_config
        self.accelerator = None
        self._ds_base: Optional[dict] = None
        if self.world_size == 1:
            self.mode = "single"
            self.device = torch.device("cpu" if cpu else "cuda")
            return
        from accelerate import Accelerator
        if self.zero_stage is None:
            self.mode = "ddp"
            self.accelerator = Accelerator(cpu=cpu)
        else:
            from accelerate.utils import DeepSpeedPlugin
            self.mode = f"zero{self.zero_stage}"
            self._ds_base = deepspeed_config(self.zero_stage, ds_config, micro_batch_size=micro_batch_size,
                                             max_grad_norm=max_grad_norm, dtype=dtype, cpu=cpu)
            mp = "bf16" if self._ds_base["bf16"]["enabled"] else ("fp16" if self._ds_base["fp16"]["enabled"]
                                                                  else "no")
            # cpu=False on purpose: accelerate drops DeepSpeed when cpu=True (module docstring)
            self.accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=copy.deepcopy(
                self._ds_base)), mixed_precision=mp)
            self._fix_accelerate_ranks()
        self.device = self.accelerator.device

    @classmethod
    def from_env(cls, **kw) -> "Distributed":
        """Configured by the sweep launcher's environment (``HARNESS_ZERO_STAGE``,
        ``HARNESS_DEEPSPEED_CONFIG``) and torchrun's (``RANK``, ``WORLD_SIZE``)."""
        z = os.environ.get(ENV_ZERO_STAGE)
        return cls(zero_stage=int(z) if z else None, ds_config=os.environ.get(ENV_DEEPSPEED_CONFIG) or None, **kw)

    def _fix_accelerate_ranks(self) -> None:
        import torch.distributed as tdist
        from accelerate.state import PartialState
        if not tdist.is_initialized():
            return
        world, rank = tdist.get_world_size(), tdist.get_rank()
        for st in (PartialState(), self.accelerator.state):
            if st.num_processes != world:
                st.num_processes = world
                st.process_index = rank
                st.local_process_index = self.local_rank

    # -- facts ----------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def zero3(self) -> bool:
        return self.mode == "zero3"

    # -- preparation ----------------------------------------------------------
    def prepare(self, model, optimizer=None):
        """Place/wrap a trained model and its optimizer. Returns ``(model, optimizer)``:
        the model is a DeepSpeed engine (ZeRO), a DDP module (ddp) or the module itself."""
        if self.mode == "single":
            return model.to(self.device), optimizer
        if self.mode == "ddp":
            if optimizer is None:
                return self.accelerator.prepare(model), None
            return self.accelerator.prepare(model, optimizer)
        # DeepSpeed: accelerate fills its plugin config in place on the first prepare; give
        # every model a fresh, fully resolved copy (so a critic gets its own engine).
        hs = getattr(getattr(model, "config", None), "hidden_size", None)
        ds = deepspeed_config(self.zero_stage, self._ds_path, micro_batch_size=self.micro_batch_size,
                              max_grad_norm=self.max_grad_norm, dtype=self.dtype, hidden_size=hs, cpu=self.cpu)
        plugin_cfg = self.accelerator.state.deepspeed_plugin.deepspeed_config  # shared with hf_ds_config
        plugin_cfg.clear()
        plugin_cfg.update(ds)
        if optimizer is None:
            engine = self.accelerator.prepare(model)
            return engine, None
        return self.accelerator.prepare(model, optimizer)

    def prepare_reference(self, model):
        """A frozen model (the KL reference): eval mode, no grads; sharded by ZeRO-3 when
        the policy is (so it costs 1/world of its memory per rank), else replicated."""
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        if self.mode != "zero3":
            return model.to(self.device)
        import deepspeed
        hs = getattr(getattr(model, "config", None), "hidden_size", None)
        ds = deepspeed_config(3, self._ds_path, micro_batch_size=self.micro_batch_size,
                              max_grad_norm=self.max_grad_norm, dtype=self.dtype, hidden_size=hs, cpu=self.cpu)
        ds.pop("optimizer", None)
        ds.pop("scheduler", None)
        engine, *_ = deepspeed.initialize(model=model, config=ds)
        engine.eval()
        return engine

    def unwrap(self, model):
        """The plain ``nn.Module`` inside an engine / DDP wrapper."""
        if self.accelerator is not None:
            return self.accelerator.unwrap_model(model)
        return model

    # -- the step ----------------------------------------------------------------
    def _engine(self, model):
        return model if hasattr(model, "set_gradient_accumulation_boundary") else None

    @contextlib.contextmanager
    def accumulate(self, model, last: bool = True) -> Iterator[None]:
        """Wrap forward + backward of one micro-batch; ``last`` marks the micro-batch after
        which :meth:`step` runs (gradients are synchronised across ranks on it)."""
        eng = self._engine(model)
        if eng is not None:
            eng.set_gradient_accumulation_boundary(bool(last))
            yield
        elif self.mode == "ddp" and not last:
            with model.no_sync():
                yield
        else:
            yield

    def backward(self, model, loss) -> None:
        eng = self._engine(model)
        if eng is not None:
            eng.backward(loss)
        elif self.accelerator is not None:
            self.accelerator.backward(loss)
        else:
            loss.backward()

    def step(self, model, optimizer) -> Optional[float]:
        """Clip (``max_grad_norm``), step and zero the gradients; returns the gradient norm
        before clipping (None where it is not computed)."""
        import torch
        eng = self._engine(model)
        if eng is not None:
            eng.set_gradient_accumulation_boundary(True)
            eng.step()
            gn = eng.get_global_grad_norm()
            return float(gn) if gn is not None else None
        params = [p for p in self.unwrap(model).parameters() if p.requires_grad]
        gn = None
        if self.max_grad_norm > 0:
            gn = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return gn

    # -- weights -------------------------------------------------------------------
    @contextlib.contextmanager
    def gathered(self, model) -> Iterator[Any]:
        """Full weights on every rank, as a plain module, for sampling / evaluation
        (read-only: changes inside are discarded under ZeRO-3). Ranks may run different
        numbers of forward passes inside. ZeRO-2/DDP/single: the unwrapped module."""
        if self.mode != "zero3":
            yield self.unwrap(model)
            return
        try:
            from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation
        except ImportError:  # older DeepSpeed: same recipe by hand
            unwrap_model_for_generation = _unwrap_for_generation
        with unwrap_model_for_generation(model), _without_start_of_forward_hook(model):
            yield model.module

    def state_dict(self, model) -> Optional[dict]:
        """Full (consolidated) state dict on the main process (None elsewhere under ZeRO-3);
        every rank must call this."""
        if self.mode == "single":
            return {k: v.detach().cpu() for k, v in model.state_dict().items()}
        sd = self.accelerator.get_state_dict(model)
        return sd if (self.is_main or self.mode != "zero3") else None

    def save_state(self, directory: str | os.PathLike) -> None:
        """Resumable state of everything prepared (engines, optimizers, RNG); every rank calls."""
        if self.accelerator is None:
            raise RuntimeError("save_state is for multi-process runs; single-process learners save their own")
        self.accelerator.save_state(str(directory))

    def load_state(self, directory: str | os.PathLike) -> None:
        if self.accelerator is None:
            raise RuntimeError("load_state is for multi-process runs")
        self.accelerator.load_state(str(directory))

    # -- collectives -----------------------------------------------------------------
    def shard(self, items: Sequence, pad: bool = False) -> list:
        """This rank's slice ``items[rank::world]``; ``pad=True`` repeats the last item so
        every rank gets the same count (ZeRO-3 forward passes are collective)."""
        items = list(items)
        mine = items[self.rank::self.world_size]
        if pad and items:
            n = -(-len(items) // self.world_size)
            while len(mine) < n:
                mine.append(items[-1])
        return mine

    def barrier(self) -> None:
        if self.is_distributed:
            import torch.distributed as tdist
            tdist.barrier()

    def mean(self, stats: dict) -> dict:
        """Average a dict of numbers over ranks (same keys on every rank)."""
        if not self.is_distributed or not stats:
            return dict(stats)
        import torch
        import torch.distributed as tdist
        keys = sorted(stats)
        t = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64)
        tdist.all_reduce(t)
        return {k: float(v) / self.world_size for k, v in zip(keys, t.tolist())}

    def gather_objects(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.is_distributed:
            return [obj]
        import torch.distributed as tdist
        out: list = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if not self.is_distributed:
            return obj
        import torch.distributed as tdist
        box = [obj]
        tdist.broadcast_object_list(box, src=src)
        return box[0]


def full_state(dist: Distributed, model) -> Optional[dict]:
    """A prepared model's full state dict on the CPU (a copy; None on the other ranks under
    ZeRO-3, where the main rank gathers it); every rank calls."""
    mod = dist.unwrap(model)
    if dist.zero3:
        import deepspeed
        with deepspeed.zero.GatheredParameters(list(mod.parameters())):
            return ({k: v.detach().cpu().clone() for k, v in mod.state_dict().items()}
                    if dist.is_main else None)
    return {k: v.detach().cpu().clone() for k, v in mod.state_dict().items()}


def load_full_state(dist: Distributed, model, sd: Optional[dict]) -> None:
    """Load a full state dict into a prepared model (needed on the main rank only under ZeRO-3,
    which scatters it); every rank calls."""
    mod = dist.unwrap(model)
    if dist.zero3:
        import deepspeed
        with deepspeed.zero.GatheredParameters(list(mod.parameters()), modifier_rank=0):
            if dist.is_main:
                mod.load_state_dict(sd)
    else:
        mod.load_state_dict(sd)


@contextlib.contextmanager
def _without_start_of_forward_hook(engine):
    """``unwrap_model_for_generation`` removes ZeRO-3's per-module hooks but not the
    engine's start-of-forward hook (``fwd_pre_hook``), and that one runs a collective
    (``assert_ints_same_as_other_ranks`` in ``reset_step``) on every forward until the
    engine has recorded a complete parameter trace, or after a trace was invalidated: ranks
    running different numbers of forwards inside :meth:`Distributed.gathered` (sampling, the
    main rank evaluating alone) would deadlock. It is taken out for the duration and put
    back first in line."""
    off = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    handle = getattr(off, "fwd_pre_hook", None)
    hooks = getattr(engine.module, "_forward_pre_hooks", None)
    fn = hooks.pop(handle.id, None) if handle is not None and hooks is not None else None
    try:
        yield
    finally:
        if fn is not None:
            hooks[handle.id] = fn
            hooks.move_to_end(handle.id, last=False)


@contextlib.contextmanager
def _unwrap_for_generation(engine):
    import deepspeed
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        off = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
        for h in off.forward_hooks + off.backward_hooks:
            h.remove()
        off.forward_hooks, off.backward_hooks = [], []
        try:
            yield engine
        finally:
            off._register_deepspeed_module(off.module)
