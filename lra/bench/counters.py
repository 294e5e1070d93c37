"""What the benchmarks count rather than time (deterministic on any machine): the FLOPs of a call
(:func:`count_flops`) and the bytes autograd saves for backward (:class:`SavedTensorBytes`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count


class SavedTensorBytes(contextlib.AbstractContextManager):
    """Bytes autograd saves for backward inside the ``with`` block (``torch.autograd.graph.saved_tensors_hooks``).

    Each saved tensor's storage is counted once (views of one storage, or a tensor saved by several
    ops, are one buffer); storages of ``exclude`` tensors (e.g. parameters, which exist anyway) are
    not counted. Read ``.bytes`` after the block.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self.seen: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda packed: packed)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.excluded:
            self.seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    def __enter__(self) -> SavedTensorBytes:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)


def _cpu_sdpa_forward_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _inplace_baddbmm_flops(self_shape, batch1_shape, batch2_shape, *args, out_shape=None, **kwargs) -> int:
    batch, rows, inner = batch1_shape
    return 2 * batch * rows * inner * batch2_shape[-1]  # the product; torch's out-of-place formula counts the same


# torch's FLOP registry covers the CUDA SDPA kernels but not the CPU flash kernel, and baddbmm but not its in-place
# form (attention/pinv.py's backward); same formulas here.
EXTRA_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_forward_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
    torch.ops.aten.baddbmm_: _inplace_baddbmm_flops,
}


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of ``fn()`` by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions, SDPA, with
    :data:`EXTRA_FLOPS`; elementwise ops, softmax and ``cdist`` are not counted by torch's registry)."""
    with FlopCounterMode(display=False, custom_mapping=EXTRA_FLOPS) as counter:
        fn()
    return int(counter.get_total_flops())
