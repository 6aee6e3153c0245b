"""The runtime: launch ranks (`launch`), the Backend interface and its backends (`backend`,
`cuda_backend`), their communicators (`communicator`, over `comm`'s gloo rings or the library's
collectives), the one PlanRunner (`execute`, with the chunked composites of `pipelined`), and timing
on ranks (`measure`).

Import the submodules directly (`from codegen.runtime import backend, launch`); this package imports
nothing on its own so that `import codegen` stays free of torch.distributed, and a backend is
imported only when asked for by name (`backend.get("cuda")` imports CuPy).
"""
