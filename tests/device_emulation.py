"""A second device on a CPU-only machine, strict the way CUDA is: ``with emulated_cuda(): ...``.

Inside the context ``torch.cuda.is_available()`` is true and ``cuda`` is a device the code can ask for. A tensor
moved there (``tensor.to("cuda")``, ``module.to(device)``, a factory with ``device="cuda"``) stays in host memory
but is *tagged*: it reports ``device == cuda:0``, and every result computed from it is tagged too. Any operation
that mixes tagged and untagged tensors raises the error CUDA raises ("Expected all tensors to be on the same
device"), with the same exceptions CUDA makes: 0-dim CPU tensors are scalars, CPU index tensors may index a device
tensor, ``copy_`` copies across devices. Converting a tagged tensor to NumPy fails as it does on CUDA, and a CPU
generator cannot drive a random op on the device. ``.cpu()`` / ``.to("cpu")`` copy and untag. Every operation
that makes the host wait for the device (a value read back, ``nonzero``, a boolean-mask index of a device tensor,
a copy to the host, ``torch.cuda.synchronize``) is recorded in ``host_reads``.

It catches a wrong device the way a GPU run would, without a GPU: a module on the device fed host tensors, host
statistics fed device features, a CPU generator drawing device noise. It does not emulate asynchrony, memory or
numerics (the arithmetic is the CPU's, in the same dtypes).
"""

from __future__ import annotations

import contextlib
import weakref
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

DEVICE = torch.device("cuda", 0)
_TAGGED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id → tensor on the emulated device
_CPU = torch.device("cpu")
_HOST_READS = {
    "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere", "unique",
    "unique_consecutive", "masked_select", "_local_scalar_dense", "equal", "allclose", "bincount",
}  # fmt: skip
_NO_COMPUTE = {"_has_compatible_shallow_copy_type", "is_same_size", "_is_zerotensor"}  # metadata, any devices


def on_device(t) -> bool:
    """Whether ``t`` is a tensor on the emulated device (kept apart from the tensor: its ``__dict__`` is
    untouched, as libraries copy it into new parameters)."""
    return isinstance(t, torch.Tensor) and _TAGGED.get(id(t)) is t


def _tag(obj, value: bool = True):
    for leaf in pytree.tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            if value:
                _TAGGED[id(leaf)] = leaf
            else:
                _TAGGED.pop(id(leaf), None)
    return obj


def _is_emulated(device) -> bool:
    if device is None or isinstance(device, int):
        return isinstance(device, int)  # a bare ordinal means a CUDA device
    return torch.device(device).type == "cuda"


def _getter(attr: str):
    return getattr(torch._C.TensorBase, attr).__get__


class DeviceMismatch(RuntimeError):
    """What CUDA raises when an operation mixes devices."""


class EmulatedCuda(TorchFunctionMode):
    """The torch-function mode behind :func:`emulated_cuda`; ``ops`` counts the operations run on the device."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.host_reads: list[str] = []  # every operation that makes the host wait for the device, by name
        self._device_get, self._is_cuda_get = _getter("device"), _getter("is_cuda")
        self._data_set = torch._C.TensorBase.data.__set__
        self._get_device = torch.Tensor.get_device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func == self._device_get:
            return DEVICE if on_device(args[0]) else func(*args)
        if func == self._is_cuda_get:
            return on_device(args[0])
        if func is self._get_device:
            return 0 if on_device(args[0]) else -1
        if func == self._data_set:
            func(*args)
            return _tag(args[0], on_device(args[1]))
        name = getattr(func, "__name__", "")
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.type_as):
            return self._move(func, args, kwargs)
        if name in ("numpy", "__array__") and on_device(args[0]):
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory "
                "first."
            )
        target = kwargs.get("device")
        if target is not None:
            kwargs["device"] = _CPU if _is_emulated(target) else target
        leaves = pytree.tree_leaves((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        tagged = any(on_device(t) for t in tensors)
        if tagged and self._reads_back(name, args, tensors):
            self.host_reads.append(name)
        self._check(func, name, args, tensors)
        generator = kwargs.get("generator")
        into_device = _is_emulated(target) if target is not None else tagged
        if generator is not None and into_device and generator.device.type != "cuda":
            raise DeviceMismatch(f"Expected a 'cuda' device type for generator but found '{generator.device.type}'")
        out = func(*args, **kwargs)
        if name == "copy_":  # the destination keeps its device
            return out
        if into_device:
            self.ops += 1
            _tag(out)
        elif target is not None:
            _tag(out, False)
        return out

    @staticmethod
    def _reads_back(name: str, args, tensors) -> bool:
        """Whether the op waits for the device: a value read by the host, or an output whose shape depends on
        device data (``nonzero``, boolean-mask indexing)."""
        if name in _HOST_READS:
            return True
        if name == "where" and len(args) == 1:  # torch.where(condition) is nonzero
            return True
        if name == "repeat_interleave":  # device repeats: the output's length is device data
            return any(on_device(t) for t in tensors[1:]) or (len(tensors) == 1 and tensors[0].dtype == torch.long)
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put"):
            index = [t for t in pytree.tree_leaves(args[1]) if isinstance(t, torch.Tensor)]
            return any(on_device(t) and t.dtype == torch.bool for t in index)
        return False

    @staticmethod
    def _check(func, name: str, args, tensors) -> None:
        if name == "copy_" or name in _NO_COMPUTE or not tensors:
            return
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put"):
            # CUDA: a CPU index may index a device tensor, never the other way round
            self_, index = args[0], args[1]
            rest = pytree.tree_leaves(args[2:])
            index_t = [t for t in pytree.tree_leaves(index) if isinstance(t, torch.Tensor)]
            if not on_device(self_) and any(on_device(t) for t in index_t):
                raise DeviceMismatch(
                    "indices should be either on cpu or on the same device as the indexed tensor (cpu)"
                )
            values = [t for t in rest if isinstance(t, torch.Tensor) and t.dim() > 0]
            if any(on_device(v) != on_device(self_) for v in values):
                raise DeviceMismatch(
                    f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
                    f"(when checking argument for {name})"
                )
            return
        devices = {on_device(t) for t in tensors if on_device(t) or t.dim() > 0}
        if len(devices) > 1:
            raise DeviceMismatch(
                f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
                f"(when checking argument for {getattr(func, '__qualname__', name)})"
            )

    def _move(self, func, args, kwargs):
        self_ = args[0]
        if func is torch.Tensor.cuda:
            return self_ if on_device(self_) else _tag(self_.clone())
        if func is torch.Tensor.cpu:
            if on_device(self_):
                self.host_reads.append("cpu")
                return _tag(self_.clone(), False)
            return func(*args, **kwargs)
        if func is torch.Tensor.type_as:
            other = args[1]
            out = func(*args, **kwargs)
            if on_device(other) != on_device(self_) and out is self_:
                out = out.clone()
            return _tag(out, on_device(other))
        # Tensor.to(device?, dtype?, non_blocking?, copy?, memory_format?) or Tensor.to(other)
        rest = list(args[1:])
        if rest and isinstance(rest[0], torch.Tensor):
            other = rest[0]
            out = func(self_, other.dtype, *rest[1:], **kwargs)
            to_device = on_device(other)
        else:
            device, _, _, _ = torch._C._nn._parse_to(*rest, **kwargs)
            if device is None:
                return _tag(func(*args, **kwargs), on_device(self_))
            to_device = _is_emulated(device)
            if rest and not isinstance(rest[0], torch.dtype) and rest[0] is not None:
                rest[0] = _CPU
            if "device" in kwargs:
                kwargs["device"] = _CPU
            out = func(self_, *rest, **kwargs)
        if on_device(self_) and not to_device:
            self.host_reads.append("to")
        if to_device != on_device(self_) and out is self_:
            out = out.clone()  # another device: another tensor
        return _tag(out, to_device)


class _Stream:
    """The emulated device's one stream: never capturing a graph; synchronising it is a host wait, recorded."""

    def __init__(self, mode: EmulatedCuda):
        self.mode = mode

    def is_capturing(self) -> bool:
        return False

    def synchronize(self) -> None:
        self.mode.host_reads.append("synchronize")


@contextlib.contextmanager
def emulated_cuda(*, autocast_on_cpu: bool = True):
    """Emulate one CUDA device (see the module docstring). ``autocast_on_cpu``: ``torch.autocast("cuda", ...)``
    becomes the CPU's autocast (bf16 on the CPU), so code choosing bf16 for CUDA runs its bf16 path."""
    mode = EmulatedCuda()
    real_autocast = torch.autocast

    def autocast(device_type, *a, **kw):
        return real_autocast("cpu" if device_type == "cuda" and autocast_on_cpu else device_type, *a, **kw)

    with contextlib.ExitStack() as stack:
        for target, value in (
            ("torch.cuda.is_available", lambda: True),
            ("torch.cuda.device_count", lambda: 1),
            ("torch.cuda.is_current_stream_capturing", lambda: False),
            ("torch.cuda.synchronize", lambda *a, **k: mode.host_reads.append("synchronize")),
            ("torch.cuda.reset_peak_memory_stats", lambda *a, **k: None),
            ("torch.cuda.max_memory_allocated", lambda *a, **k: 0),
            ("torch.accelerator.current_stream", lambda *a, **k: _Stream(mode)),
            ("torch.autocast", autocast),
        ):
            stack.enter_context(mock.patch(target, value))
        stack.enter_context(mode)
        stack.callback(_TAGGED.clear)
        yield mode
