"""Which code runs each attention-related op: the forms, the one table, and what ``auto`` picks (``attention.impl``).

``attention.impl`` (one key per attention node, ``auto`` by default; docs/attention.md "Forms") names the form a
variant runs, as Hugging Face's ``attn_implementation`` or flash-linear-attention's ``mode=``:

* ``pytorch``: plain PyTorch operators, no custom kernel, on any device (what compiled code runs too);
* ``cpu``: the C++ kernels (``kernels/<method>/cpu.cpp``) on CPU tensors, each where the operands fit (float32,
  ``d`` a multiple of the vector width, at most 128 landmarks; eager, outside dispatch modes: a ctypes call cannot be
  traced), else that op's PyTorch form, the same maths;
* ``fused``: the forms written for GPUs (:mod:`attention.landmark_stages`: batched GEMMs over the ``n × m`` weights
  split over ``n`` in the inputs' dtype, selection by sorting chunks, no host sync), with the Triton pseudo-inverse,
  landmark means and rows stage (``Forms.rows``: FlashCUR's rows kernels) where they run;
* ``triton``: the method's own Triton kernels (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``).

:data:`TABLE` maps ``(family, impl)`` to the devices it runs on, the dtypes it takes and, per device, the form of
every op (:class:`Forms`: the attention products, the pseudo-inverse, the landmark selection, Nyström's landmarks);
:data:`AUTO` says what ``auto`` picks per device and why. A variant names its family in its class attribute
``impl_family``; a variant without one (softmax, LiZA, MEGA, Proxyformer, the linear-cost variants, any new pure
PyTorch one) has the single form ``pytorch`` and needs no row. :func:`resolve` reads only static facts (the device
type, the dtype, the configured impl), so ``forward`` stays free of host syncs and ``torch.compile`` traces it as
constants. A form that cannot run where it is asked is refused with one line naming the forms that can: at the start
of a run for the trainer's device (:func:`model_forms`, printed and recorded by :mod:`lra.train`), and at the first
forward on any other device.

Dropout's form is the device's (:mod:`models.dropout`: the hash kernel ``lra::dropout`` on CPU tensors, ``F.dropout``
elsewhere); :func:`model_forms` records it beside the attention's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from kernels.common.launch import interpreted
from kernels.dropout.cpu import kernel_available

IMPLS = ("auto", "pytorch", "cpu", "fused", "triton")
ANY = "*"  # a row's device key: every device


@dataclass(frozen=True)
class Forms:
    """The form of each op one attention call runs (``None``: the variant has no such op)."""

    attention: str = "pytorch"
    pinv: str | None = None
    selection: str | None = None
    landmarks: str | None = None  # Nyström's landmark means and sequence conv
    rows: str | None = None  # the fused forms' rows stage (CUR's R V, Nyström's k3 V): attention.landmark_stages

    def record(self) -> dict[str, str]:
        """The ops this variant has and their forms, e.g. ``{"attention": "cpu", "pinv": "cpu", ...}``."""
        return {op: form for op, form in asdict(self).items() if form is not None}


@dataclass(frozen=True)
class Row:
    """One ``(family, impl)``: ``forms`` per device type (``ANY``: all), the dtypes it takes (None: every float)."""

    forms: dict[str, Forms]
    dtypes: tuple[torch.dtype, ...] | None = None
    why: str = ""


_CPU_CUR = Forms("cpu", pinv="cpu", selection="cpu")
_FUSED_CUR_GPU = Forms("fused", pinv="triton", selection="fused", rows="triton")
_CPU_NYSTROM = Forms("cpu", pinv="cpu", landmarks="cpu")
_FUSED_NYSTROM_GPU = Forms("fused", pinv="triton", landmarks="triton", rows="triton")
_FUSED_ROWS_CPU = "triton" if interpreted() else "fused"  # FlashCUR's rows kernels run on CPU in the interpreter

TABLE: dict[tuple[str, str], Row] = {
    # CUR (curformer, l1_cur, megacur): CURAttention and its subclasses
    ("cur", "cpu"): Row({"cpu": _CPU_CUR}, why="training: the whole step as one node over the landmark kernels "
                        "(kernels.cur.cpu); the selection and pseudo-inverse kernels"),
    ("cur", "pytorch"): Row({ANY: Forms("pytorch", pinv="pytorch", selection="pytorch")},
                            why="SDPA / materialised scores, bmm steps, topk selection"),
    ("cur", "fused"): Row({"cuda": _FUSED_CUR_GPU, "meta": _FUSED_CUR_GPU,
                           "cpu": Forms("fused", pinv="pytorch", selection="fused", rows=_FUSED_ROWS_CPU)},
                          why="softmax score: the landmark stages split over n, R V by FlashCUR's rows kernels "
                              "where they take the shape (other scores: their PyTorch products); the pseudo-inverse "
                              "in Triton on CUDA for float32 and m <= 64, else bmm steps"),
    # FlashCUR: the same CUR, its products in Triton; the pseudo-inverse by the C++ kernel on CPU (interpreter)
    ("flashcur", "triton"): Row({"cuda": Forms("triton", pinv="triton", selection="fused"),
                                 "meta": Forms("triton", pinv="triton", selection="fused"),
                                 "cpu": Forms("triton", pinv="cpu", selection="cpu")},
                                dtypes=(torch.float32, torch.float16, torch.bfloat16),
                                why="the three FlashCUR kernels (kernels.cur.ops)"),
    # Nyströmformer
    ("nystrom", "cpu"): Row({"cpu": _CPU_NYSTROM}, why="landmark-attention kernels for k3 V and k1 W, the C++ "
                            "segment sums and sequence conv, the C++ pseudo-inverse"),
    ("nystrom", "pytorch"): Row({ANY: Forms("pytorch", pinv="pytorch", landmarks="pytorch")},
                                why="SDPA, scatter_add segment sums, banded-matrix conv, bmm steps"),
    ("nystrom", "fused"): Row({"cuda": _FUSED_NYSTROM_GPU, "meta": _FUSED_NYSTROM_GPU,
                               "cpu": Forms("fused", pinv="pytorch", landmarks="triton" if interpreted() else "pytorch",
                                            rows=_FUSED_ROWS_CPU)},
                              why="landmark stages split over n (k3 V by FlashCUR's rows kernels where they take the "
                                  "shape), Triton landmark means where they run (else one SDPA call), one depthwise "
                                  "conv2d"),
    # exact L1-distance attention
    ("l1", "cpu"): Row({"cpu": Forms("cpu")}, why="query-chunked C++ distances and sign gradients, dropout inside (kernels.l1.cpu)"),
    ("l1", "pytorch"): Row({ANY: Forms("pytorch")}, why="cdist and the materialised n x n weights"),
    ("l1", "triton"): Row({"cuda": Forms("triton")}, why="FlashL1 (kernels.l1.ops); training with attention dropout "
                          "runs the materialised weights (FlashL1 has no dropout) and warns"),
}

AUTO: dict[str, dict[str, tuple[str, str]]] = {  # family -> device type -> (impl, why auto picks it)
    "cur": {"cpu": ("cpu", "the C++ kernels are the fastest CPU form (docs/bench.md)"),
            ANY: ("fused", "the GPU forms: batched GEMMs split over n, no host sync")},
    "flashcur": {ANY: ("triton", "FlashCUR is its Triton kernels (attention=curformer is the same method in "
                                 "PyTorch)")},
    "nystrom": {"cpu": ("cpu", "the C++ kernels are the fastest CPU form (docs/bench.md)"),
                ANY: ("fused", "the GPU forms: batched GEMMs split over n, no host sync")},
    "l1": {"cpu": ("cpu", "the C++ kernels (there is no faster CPU form; n x n weights are never stored)"),
           "cuda": ("triton", "FlashL1: online softmax, nothing n x n stored"),
           ANY: ("pytorch", "no kernel for this device (meta: shapes only)")},
}


def family_of(module: nn.Module) -> str | None:
    """The table family of an attention module (its class's ``impl_family``), None for single-form variants."""
    return getattr(type(module), "impl_family", None)


def impls(family: str | None) -> list[str]:
    """The forms ``attention.impl`` may name for ``family`` (``auto`` first)."""
    return ["auto", *sorted(impl for fam, impl in TABLE if fam == family)] if family else ["auto", "pytorch"]


def check_impl(impl: str, family: str | None, variant: str) -> str:
    """``impl`` if ``family`` has that form, else a config error naming the forms it has."""
    if impl not in impls(family):
        raise ValueError(f"attention.impl={impl!r} is not a form of {variant}: it has {impls(family)} "
                         f"(docs/attention.md \"Forms\")")
    return impl


def _runs(family: str | None, impl: str, device: str, dtype: torch.dtype) -> bool:
    """Whether ``(family, impl)`` runs on ``device`` tensors of ``dtype`` (no error)."""
    if family is None:
        return impl in ("auto", "pytorch")
    if impl == "auto":
        return True
    row = TABLE[(family, impl)]
    on_device = device in row.forms or ANY in row.forms
    if impl == "triton" and device == "cpu":
        on_device = on_device and interpreted()
    return on_device and (row.dtypes is None or dtype in row.dtypes)


def resolve(family: str | None, impl: str, device: str, dtype: torch.dtype, variant: str = "this variant") -> Forms:
    """The :class:`Forms` that ``(family, impl)`` runs on ``device`` tensors of ``dtype``: ``auto`` per :data:`AUTO`;
    a form that cannot run there is refused with one line naming the forms that can."""
    if family is None:
        check_impl(impl, None, variant)
        return Forms()
    if impl == "auto":
        picks = AUTO[family]
        impl = (picks.get(device) or picks[ANY])[0]
    if not _runs(family, impl, device, dtype):
        usable = [name for name in impls(family)[1:] if _runs(family, name, device, dtype)]
        hint = " (Triton on CPU needs TRITON_INTERPRET=1 set before Python starts)" if impl == "triton" else ""
        raise ValueError(f"attention.impl={impl} of {variant} cannot run on {device} tensors of {dtype}{hint}; "
                         f"forms that can: {usable or 'none'} (docs/attention.md \"Forms\")")
    forms = TABLE[(family, impl)].forms
    return forms.get(device) or forms[ANY]


def forms_for(module: nn.Module, x: torch.Tensor) -> Forms:
    """:func:`resolve` for the attention ``module`` (its configured ``impl``, default ``auto``) on ``x``'s device and
    dtype: what its ``forward`` calls first."""
    return resolve(family_of(module), getattr(module, "impl", "auto"), x.device.type, x.dtype, type(module).__name__)


def configure(module: nn.Module, impl: str, variant: str) -> nn.Module:
    """Set ``impl`` on ``module`` and on every attention submodule of a family (MEGA's CUR inside MEGA's node),
    after checking that the variant has that form (a config error at build time, before anything runs)."""
    families = [sub for sub in module.modules() if family_of(sub) is not None]
    check_impl(impl, family_of(families[0]) if families else None, variant)
    module.impl = impl
    for sub in families:
        sub.impl = impl
    for sub in module.modules():
        if hasattr(sub, "kernels"):  # scores: their C++ kernels on CPU tensors in the cpu form (auto's there) only
            sub.kernels = impl in ("auto", "cpu")
    return module


def dropout_form(device: str) -> str:
    """Dropout's form on ``device`` (:mod:`models.dropout`): the hash kernel ``lra::dropout`` on CPU when it is built,
    else ``F.dropout`` (``pytorch``)."""
    return "cpu" if device == "cpu" and kernel_available() else "pytorch"


def model_forms(model: nn.Module, device: torch.device | str, dtype: torch.dtype = torch.float32) -> dict[str, str]:
    """The form of every attention-related op of ``model`` on ``device``: ``{"attention": ..., "pinv": ...,
    "dropout": ...}`` (one attention family per model; the first attention module found decides), refusing a form
    that cannot run there (:func:`resolve`). What a run prints first and records (``results.json``, W&B)."""
    device = torch.device(device).type
    impl = next((sub.impl for sub in model.modules() if isinstance(getattr(sub, "impl", None), str)), "auto")
    family = next((sub for sub in model.modules() if family_of(sub) is not None), None)
    forms = Forms() if family is None else resolve(family_of(family), family.impl, device, dtype, type(family).__name__)
    return {"impl": impl, **forms.record(), "dropout": dropout_form(device)}
