"""Microbenchmarks, outside the project's packages (not installed; run from the checkout):

    python -m benchmarks.kernels      # the generated Adam kernel against torch.optim.Adam(fused=True)
    python -m benchmarks.comm         # the runtime's collectives against gloo's own, on local ranks
    python -m benchmarks.simulator    # the cost model's speed: the DES and the closed form at scale
    python -m benchmarks.repredict RUN  # a run's measured points predicted on another topology

They may import any layer (they measure them); no package imports them.
"""
