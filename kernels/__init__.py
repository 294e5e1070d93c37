"""The kernels, pure functions over tensors, by method and then by device (as flash-linear-attention's
``fla/ops/<method>/``); the methods that call them and the choice of form: ``attention/`` (kernels/README.md).

Every ``kernels/<method>/`` holds the method's one plain PyTorch reference ``naive.py`` (what every form is tested
against; it calls no kernel), its Triton kernels (``forward.py`` / ``backward.py`` the ``@triton.jit`` kernels,
``launch.py`` the launch parameters and launches, ``ops.py`` the ``torch.library`` custom ops or autograd Functions
over them) and its C++ kernels for the CPU (``cpu.cpp``, bound with their autograd nodes or custom op by ``cpu.py``):

* :mod:`kernels.cur`: FlashCUR's Triton kernels, and CUR's CPU training node over the landmark attention;
* :mod:`kernels.l1`: exact L1-distance attention, FlashL1 (Triton) and the CPU distances;
* :mod:`kernels.pinv`: the iterative pseudo-inverse, Triton, C++ and the PyTorch form;
* :mod:`kernels.segment_means`: Nyströmformer's landmarks (Triton);
* :mod:`kernels.landmark_attention`: attention with a few keys or a few queries (C++), what CUR and Nyström share;
* :mod:`kernels.selection`: CUR's landmark selection (C++);
* :mod:`kernels.seqconv`: Nyström's depthwise sequence conv and segment sums (C++);
* :mod:`kernels.dropout`: dropout by a hash of (seed, index) (C++, custom op ``lra::dropout``);
* :mod:`kernels.common`: what they share: the Triton launch and AOT compilation, the C++ build driver
  (:mod:`kernels.common.build`) and headers, autocast off, the selected rows.

The Triton kernels run on CUDA tensors, or on CPU with ``TRITON_INTERPRET=1`` set before a kernel module is
imported; the C++ kernels on CPU tensors, built on first use.
"""
