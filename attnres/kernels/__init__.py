"""The depth attention's computation: the two-phase autograd functions (:mod:`~attnres.kernels.two_phase`) and
the kernels they hand element-wise work to, C++ on CPU (:mod:`~attnres.kernels.cpu`, ``cpu.cpp``) and
``torch.compile`` fusions on GPU (:mod:`~attnres.kernels.fused`)."""
