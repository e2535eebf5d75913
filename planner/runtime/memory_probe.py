"""Memory ground truth of one training step of the planner runtime (`train.py --measure-memory`).

`MemoryProbe` wraps one step (forward, backward, optimizer step) of this rank and measures, in bytes:

* model states at rest, read from the objects after the step: `param_bytes` (local shards: a DTensor's
  `_local_tensor`, FSDP2's sharded parameters), `grad_bytes` (the same for `.grad`), `optimizer_bytes`
  (every tensor in `optimizer.state`: AdamW's exp_avg, exp_avg_sq and its 0-d fp32 `step` per parameter);
* saved for backward: a `torch.autograd.graph.saved_tensors_hooks` pair sees every tensor autograd keeps
  for backward.  Each storage is counted once (keyed by its `untyped_storage()`, bytes = its `nbytes()`),
  from the pack until autograd drops the last saved reference (the packed holder's `__del__`) or the
  storage is freed.  Storages of parameters, buffers, optimizer state, FSDP2's gathered parameters and
  the input batch are not activations and are left out.  Non-reentrant activation checkpointing packs
  its inner tensors into its own hooks (the innermost hooks win) and keeps only the wrapped block's
  inputs alive, through a closure: a forward pre-hook on each `CheckpointWrapper` counts those inputs as
  saved until the input's gradient arrives (or they are freed).  What the recomputation in backward keeps
  for the block's backward (torch.utils.checkpoint's `_recomputation_hook`, wrapped while the probe runs)
  counts as saved until checkpointing drops its reference (or the storage is freed): the recompute
  working set.  Reported:
  `saved_per_microbatch` (bytes newly saved by the chunk forwards of the step divided by the
  micro-batches: one micro-batch through this rank's whole stage; recomputation not included),
  `saved_by_layer` (the same by the module that saved it: attention = attention_norm + attention (and a
  checkpointed block's input), mlp = ffn_norm + feed_forward, embedding, final_norm, head, loss =
  outside any module), `saved_forward_peak` (the most forward-saved bytes alive at once: micro-batches in
  flight x saved per micro-batch) and `saved_peak` (the same with the recompute working set);
* live tensor bytes: a `TorchDispatchMode` sees the output of every aten op (DTensor ops desugar to their
  local ops first) and tracks each new storage by a weak reference until it is freed;
  `UntypedStorage.resize_` is wrapped because FSDP2 frees and re-allocates its gathered parameters by
  resizing storages, which no op reports.  The states at rest, buffers, FSDP2's all-gather outputs and the
  input batch are registered when the step starts, and so are the pipeline stages' receive buffers
  (allocated once, one per micro-batch and direction).  Reported: `live_peak` (the most bytes alive at once
  during the step) and what they were at that moment (`peak_by_kind`: params, optimizer, buffers, inputs,
  gathered = FSDP2's unsharded parameters, pipeline = receive buffers not saved for backward at that
  moment, saved = saved for backward, grads = gradients alive then,
  other = everything else: the running op's temporaries, activation gradients, received activations,
  the pipeline's kept stage outputs);
* FSDP2's gathered (unsharded) parameters: bytes of every `FSDPParam.all_gather_outputs` storage (resized
  to 0 when resharded) plus the unsharded gradients FSDP2 holds before its reduce-scatter
  (`_unsharded_param.grad`, `unsharded_accumulated_grad`), sampled after every op: `gathered_peak`
  (weights + gradients at their joint peak), `gathered_weights_peak`, `gathered_grads_peak`.

Exact in what it counts: bytes are storage sizes (what the tensors asked for), every storage once however
many views or saved references share it.  Not counted: allocator rounding and caching, memory an op
allocates and frees inside itself (a kernel's workspace, gloo's own buffers), Python objects.  On CPU in
fp32 with no caching allocator, that is what the process holds in tensors.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_map_only

KINDS = ("params", "optimizer", "buffers", "inputs", "gathered", "pipeline", "saved", "other")  # + `grads` at the peak
NOT_ACTIVATIONS = ("params", "optimizer", "buffers", "inputs", "gathered")


def storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The untyped storages under `t` (a DTensor's or other wrapper subclass's inner tensors)."""
    out, todo = [], [t]
    while todo:
        obj = todo.pop()
        if is_traceable_wrapper_subclass(obj):
            attrs, _ = obj.__tensor_flatten__()
            todo.extend(getattr(obj, a) for a in attrs if isinstance(getattr(obj, a), torch.Tensor))
        elif isinstance(obj, torch.Tensor):
            out.append(obj.untyped_storage())
    return out


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes of the local part of `t` (a DTensor's shard), 0 for None."""
    if t is None:
        return 0
    local = t._local_tensor if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _optimizer_states(optimizers: Sequence[torch.optim.Optimizer]):
    for optimizer in optimizers:
        yield from optimizer.state.values()


def state_bytes(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, int]:
    """Parameters, gradients and optimizer state this rank holds locally (each parameter once)."""
    params = list({id(p): p for p in model.parameters()}.values())
    opt = sum(local_bytes(v) for state in _optimizer_states(optimizers) for v in state.values()
              if isinstance(v, torch.Tensor))
    return {"param_bytes": sum(local_bytes(p) for p in params),
            "grad_bytes": sum(local_bytes(p.grad) for p in params),
            "optimizer_bytes": opt}


def fsdp_params(module: nn.Module) -> list:
    """FSDP2's FSDPParam objects of every fully_shard-ed module under `module` (empty without FSDP2)."""
    out, seen = [], set()
    for sub in module.modules():
        get_state = getattr(sub, "_get_fsdp_state", None)
        if get_state is None:
            continue
        for group in get_state()._fsdp_param_groups:
            for fp in group.fsdp_params:
                if id(fp) not in seen:
                    seen.add(id(fp))
                    out.append(fp)
    return out


def pipeline_buffers(stages) -> list[torch.Tensor]:
    """The receive buffers torch.distributed.pipelining's stages allocate once, one per micro-batch: the
    activations a stage receives (`args_recv_info`) and the gradients it receives (`grad_recv_info`)."""
    out = []
    for stage in stages:
        for infos in (*getattr(stage, "args_recv_info", {}).values(), *getattr(stage, "grad_recv_info", {}).values()):
            for info in infos if isinstance(infos, (tuple, list)) else (infos,):
                buffer = getattr(info, "buffer", None)
                if isinstance(buffer, torch.Tensor):
                    out.append(buffer)
    return out


def layer_label(name: str) -> str:
    """The cost model's layer of a module path inside a chunk: tok_embeddings -> embedding,
    layers.3.attention.wq -> attention, layers.3.ffn_norm -> mlp, layers.3 (a checkpointed block's input,
    which the cost model puts on its attention) -> attention, norm -> final_norm, output -> head."""
    parts = [p for p in name.split(".") if p != "_checkpoint_wrapped_module"]
    if not parts or not parts[0]:
        return "loss"
    if parts[0] == "layers":
        if len(parts) < 3:
            return "attention"
        return "attention" if parts[2] in ("attention_norm", "attention") else "mlp"
    return {"tok_embeddings": "embedding", "norm": "final_norm", "output": "head"}.get(parts[0], parts[0])


class _Record:
    """One tracked storage for its lifetime: bytes, kind, saved-for-backward references (forward, recompute)."""

    __slots__ = ("nbytes", "kind", "home", "ref", "saved", "recomputed", "alive")

    def __init__(self, nbytes: int, kind: str):
        self.nbytes, self.kind, self.home = nbytes, kind, kind
        self.ref: weakref.ref[torch.UntypedStorage] | None = None
        self.saved = self.recomputed = 0
        self.alive = True


class _Saved:
    """What the pack hook returns: the tensor, and the records it keeps counted as saved until released."""

    __slots__ = ("tensor", "records", "probe", "__weakref__")

    def __init__(self, tensor, records, probe):
        self.tensor, self.records, self.probe = tensor, records, probe

    def release(self) -> None:
        probe, self.probe = self.probe, None
        if probe is not None:
            for rec in self.records:
                probe._count(rec, saved=-1)

    def __del__(self):
        self.release()


class _LiveMode(TorchDispatchMode):
    def __init__(self, probe: "MemoryProbe"):
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local ops, which come back here
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self.probe._track_output, out)
        self.probe._sample()
        return out


class MemoryProbe:
    """Measure one step: `with MemoryProbe(chunks, optimizers, inputs=(tokens, labels), micro_batches=m) as probe:`
    run the step, then `probe.report(model)`.  `optimizers`: the step's optimizers (one per chunk)."""

    def __init__(self, chunks: list[nn.Module], optimizers: Sequence[torch.optim.Optimizer], *, inputs=(),
                 micro_batches: int = 1, pipeline_stages=()):
        self.chunks, self.optimizers, self.inputs, self.micro_batches = chunks, optimizers, inputs, micro_batches
        self.pipeline_stages = list(pipeline_stages)
        self._records: dict[int, _Record] = {}
        self.live = dict.fromkeys(KINDS, 0)
        self.live_total = self.live_peak = 0
        self.peak_by_kind = dict(self.live)
        self.saved_live = self.saved_peak = 0  # forward-saved or recomputed
        self.forward_live = self.forward_peak = 0  # forward-saved only
        self._forwards: list[dict[str, int]] = []  # bytes newly saved per chunk forward, by layer
        self._labels: list[str] = []  # module stack (layer labels) of the running forward
        self._fsdp: list = []
        self.gathered_weights_peak = self.gathered_grads_peak = self.gathered_peak = 0
        self._handles: list = []
        self._pending: list[_Saved] = []
        self._restore: list = []
        self._mode: _LiveMode | None = None
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._active = False

    # ------------------------------------------------------------ live storages

    def _register(self, st: torch.UntypedStorage, kind: str) -> _Record:
        key = id(st)
        rec = self._records.get(key)
        if rec is not None:
            return rec
        rec = _Record(st.nbytes(), kind)
        rec.ref = weakref.ref(st, partial(self._freed, key))
        self._records[key] = rec
        self.live[kind] += rec.nbytes
        self.live_total += rec.nbytes
        return rec

    def _freed(self, key: int, _ref) -> None:
        rec = self._records.pop(key, None)
        if rec is None:
            return
        # freed while still counted as saved: a checkpoint's inputs (dropped at recompute), recomputed tensors
        self._count(rec, saved=-rec.saved, recomputed=-rec.recomputed)
        rec.alive = False
        self.live[rec.kind] -= rec.nbytes
        self.live_total -= rec.nbytes

    def _track_output(self, t: torch.Tensor) -> None:
        for st in storages(t):
            rec = self._records.get(id(st))
            if rec is None:
                self._register(st, "other")
            elif rec.nbytes != st.nbytes():
                self._resized(st, rec)

    def _resized(self, st: torch.UntypedStorage, rec: _Record) -> None:
        new = st.nbytes()
        self.live[rec.kind] += new - rec.nbytes
        self.live_total += new - rec.nbytes
        if rec.saved or rec.recomputed:
            self.saved_live += new - rec.nbytes
        if rec.saved:
            self.forward_live += new - rec.nbytes
        rec.nbytes = new

    def _grad_tensors(self):
        for chunk in self.chunks:
            for p in chunk.parameters():
                yield p.grad
        for fp in self._fsdp:
            yield fp.sharded_param.grad
            unsharded = getattr(fp, "_unsharded_param", None)
            yield None if unsharded is None else unsharded.grad
            yield getattr(fp, "unsharded_accumulated_grad", None)

    def _sample(self) -> None:
        if self.live_total > self.live_peak:
            self.live_peak = self.live_total
            self.peak_by_kind = dict(self.live)
            # the gradients alive at this moment (local, sharded or FSDP2's unsharded ones), out of `other`
            seen: set[int] = set()
            grads = 0
            for g in self._grad_tensors():
                for st in storages(g) if g is not None else ():
                    rec = self._records.get(id(st))
                    if id(st) not in seen and rec is not None and rec.kind == "other":
                        seen.add(id(st))
                        grads += rec.nbytes
            if grads:
                self.peak_by_kind["grads"] = grads
                self.peak_by_kind["other"] -= grads
        if self._fsdp:
            weights = self.live["gathered"]
            grads = 0
            for fp in self._fsdp:
                unsharded = getattr(fp, "_unsharded_param", None)
                if unsharded is not None:
                    grads += local_bytes(unsharded.grad)
                grads += local_bytes(getattr(fp, "unsharded_accumulated_grad", None))
            self.gathered_weights_peak = max(self.gathered_weights_peak, weights)
            self.gathered_grads_peak = max(self.gathered_grads_peak, grads)
            self.gathered_peak = max(self.gathered_peak, weights + grads)

    # ------------------------------------------------------------ saved for backward

    def _count(self, rec: _Record, *, saved: int = 0, recomputed: int = 0) -> None:
        """Change a record's saved references; keep the saved totals and its kind in step."""
        if not rec.alive:
            return
        was_any, was_forward = bool(rec.saved or rec.recomputed), bool(rec.saved)
        rec.saved = max(0, rec.saved + saved)
        rec.recomputed = max(0, rec.recomputed + recomputed)
        is_any, is_forward = bool(rec.saved or rec.recomputed), bool(rec.saved)
        if is_any != was_any:
            sign = 1 if is_any else -1
            self.saved_live += sign * rec.nbytes
            kind = "saved" if is_any else rec.home
            if rec.home in ("other", "pipeline") and rec.kind != kind:
                self.live[rec.kind] -= rec.nbytes
                self.live[kind] += rec.nbytes
                rec.kind = kind
        if is_forward != was_forward:
            self.forward_live += (1 if is_forward else -1) * rec.nbytes
        self.saved_peak = max(self.saved_peak, self.saved_live)
        self.forward_peak = max(self.forward_peak, self.forward_live)

    def _activation(self, st: torch.UntypedStorage) -> _Record | None:
        rec = self._records.get(id(st))
        if rec is None:
            rec = self._register(st, "other")
        if rec.kind in NOT_ACTIVATIONS or rec.nbytes == 0:
            return None
        return rec

    def _save(self, t: torch.Tensor) -> list[_Record]:
        """Count the storages of `t` as saved by the running forward (new ones attributed to its layer)."""
        out = []
        for st in storages(t):
            rec = self._activation(st)
            if rec is None:
                continue
            if rec.saved == 0 and self._forwards:
                self._forwards[-1][self._labels[-1] if self._labels else "loss"] += rec.nbytes
            self._count(rec, saved=1)
            out.append(rec)
        return out

    def _pack(self, t: torch.Tensor):
        if not self._active:
            return t
        records = self._save(t)
        return _Saved(t, records, self) if records else t

    @staticmethod
    def _unpack(obj):
        return obj.tensor if isinstance(obj, _Saved) else obj

    def _recomputed(self, t: torch.Tensor, held: torch.Tensor) -> None:
        # a tensor the checkpoint recomputes in backward for its block's backward: saved until checkpointing
        # drops `held`, the alias it keeps (a pipeline's receive buffer outlives that), or until freed
        if not self._active:
            return
        records = [rec for rec in map(self._activation, storages(t)) if rec is not None]
        for rec in records:
            self._count(rec, recomputed=1)
        if records:
            weakref.finalize(held, self._dropped, records)

    def _dropped(self, records: list[_Record]) -> None:
        for rec in records:
            self._count(rec, recomputed=-1)

    def _checkpoint_inputs(self, _module, args) -> None:
        # non-reentrant checkpointing keeps the block's inputs (its recompute closure) until its backward
        if not self._active:
            return
        for t in args:
            if not isinstance(t, torch.Tensor):
                continue
            records = self._save(t)
            if not records:
                continue
            holder = _Saved(None, records, self)
            self._pending.append(holder)  # released when the input's gradient arrives, or when it is freed
            if t.requires_grad:
                t.register_hook(lambda grad, holder=holder: holder.release())

    # ------------------------------------------------------------ context

    def _start_forward(self, _module, _args) -> None:
        self._forwards.append(defaultdict(int))
        # checkpointing's recompute stops early (torch.utils.checkpoint's _StopRecomputationError) and skips
        # the forward hooks that would pop its modules: a new forward starts from an empty stack
        self._labels.clear()

    def _push(self, name: str, _module, _args) -> None:
        self._labels.append(layer_label(name))

    def _pop(self, _module, _args, _out) -> None:
        if self._labels:
            self._labels.pop()

    def _register_at_rest(self) -> None:
        # states, buffers, FSDP2's gathered storages (resized to 0 when resharded) and the batch
        for chunk in self.chunks:
            self._fsdp += fsdp_params(chunk)
        for fp in self._fsdp:
            for t in fp.all_gather_outputs:
                for st in storages(t):
                    self._register(st, "gathered")
            for st in storages(fp.sharded_param):  # also while the module shows its unsharded parameters
                self._register(st, "params")
        for chunk in self.chunks:
            for p in chunk.parameters():
                for st in storages(p):
                    self._register(st, "params")
                for st in storages(p.grad) if p.grad is not None else ():
                    self._register(st, "other")
            for b in chunk.buffers():
                for st in storages(b):
                    self._register(st, "buffers")
        for state in _optimizer_states(self.optimizers):
            for value in state.values():
                for st in storages(value) if isinstance(value, torch.Tensor) else ():
                    self._register(st, "optimizer")
        for t in self.inputs:
            for st in storages(t) if isinstance(t, torch.Tensor) else ():
                self._register(st, "inputs")
        for buffer in pipeline_buffers(self.pipeline_stages):
            for st in storages(buffer):
                self._register(st, "pipeline")

    def _patch(self, owner, name: str, make) -> None:
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._restore.append((owner, name, original))

    def __enter__(self) -> "MemoryProbe":
        import torch.utils.checkpoint as checkpoint
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

        self._register_at_rest()
        self.live_peak = self.live_total
        self.peak_by_kind = dict(self.live)
        probe = self

        def resize_patch(original):
            def resize_(st, size):
                out = original(st, size)
                rec = probe._records.get(id(st))
                if rec is not None and rec.nbytes != st.nbytes():
                    probe._resized(st, rec)
                    probe._sample()
                return out
            return resize_

        def recompute_patch(original):
            def __init__(hook, *args, **kwargs):
                original(hook, *args, **kwargs)
                inner = hook.pack_hook

                def pack_hook(x):
                    # checkpointing stores x (detached if it needs grad); hand it an alias of our own, whose
                    # lifetime is that reference's
                    held = x.detach()
                    probe._recomputed(x, held)
                    return inner(held)

                hook.pack_hook = pack_hook
            return __init__

        self._patch(torch.UntypedStorage, "resize_", resize_patch)
        self._patch(checkpoint._recomputation_hook, "__init__", recompute_patch)
        for chunk in self.chunks:
            self._handles.append(chunk.register_forward_pre_hook(self._start_forward))
            for name, module in chunk.named_modules():
                if name:
                    self._handles.append(module.register_forward_pre_hook(partial(self._push, name)))
                    self._handles.append(module.register_forward_hook(self._pop))
                if isinstance(module, CheckpointWrapper):
                    self._handles.append(module.register_forward_pre_hook(self._checkpoint_inputs))
        hooks, mode = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), _LiveMode(self)
        hooks.__enter__()
        mode.__enter__()
        self._hooks, self._mode = hooks, mode
        self._active = True
        self._sample()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._active = False
        if self._mode is not None and self._hooks is not None:  # entered
            self._mode.__exit__(*exc)
            self._hooks.__exit__(*exc)
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for holder in self._pending:
            holder.release()
        self._pending.clear()

    # ------------------------------------------------------------ result

    def report(self, model: nn.Module) -> dict:
        """Bytes measured on this rank (see the module docstring); call after the step."""
        by_layer: dict[str, int] = defaultdict(int)
        for forward in self._forwards:
            for label, nbytes in forward.items():
                by_layer[label] += nbytes
        m = max(1, self.micro_batches)
        out: dict[str, Any] = dict(state_bytes(model, self.optimizers))
        out.update({
            "saved_per_microbatch": sum(by_layer.values()) / m,
            "saved_by_layer": {k: v / m for k, v in sorted(by_layer.items())},
            "chunk_forwards": len(self._forwards),
            "saved_forward_peak": self.forward_peak,
            "saved_peak": self.saved_peak,
            "live_peak": self.live_peak,
            "peak_by_kind": {k: v for k, v in self.peak_by_kind.items() if v},
            "gathered_peak": self.gathered_peak,
            "gathered_weights_peak": self.gathered_weights_peak,
            "gathered_grads_peak": self.gathered_grads_peak,
        })
        return out
