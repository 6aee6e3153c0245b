"""CPU/GPU runtime: launch ranks (`launch`), talk between them (`comm`), execute Plans (`execute`).

Import the submodules directly (`from codegen.runtime import comm, launch`); this package imports
nothing on its own so that `import codegen` stays free of torch.distributed.
"""
