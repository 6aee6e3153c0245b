"""The cost model: simulate a Plan on a Topology (SimPy DES), with a closed-form oracle.

Layers, as in ASTRA-sim:
- `topology`: validated, frozen hardware data (suite/conf/topology/*.yaml or a calibrated file):
  `load_topology(name, nodes, path) -> Topology`, `Topology.from_dict`, `dump_topology`;
  `TopologyError` names the field at fault.
- `nccl`: NCCL's own cost model and tuner (NCCL 2.20.3's tuning.cc: algorithm x protocol ->
  latency + bytes / bandwidth, the pick; enqueue.cc: the channels and chunks a call runs on, with
  a per-slice and a pipeline-fill cost fitted per system), which every
  collective and P2P on a GPU topology (one with an `nccl` section) costs, in the DES and the
  closed form alike (`pick`, `call`, `time_us`, `p2p_us`).
- `network`: links and ports as SimPy resources, compute with the overlap slowdowns, the trace
  (`Sim`; `hop`/`hop_us`: a message's route and uncontended time).
- `collectives`: NCCL calls on GPU topologies; for the CPU runtime ring, double binary tree, hierarchical, chain and direct algorithms as chunked,
  pipelined transfers (`CollSpec`, `simulate`).
- `workload`: a Plan becomes a task DAG per rank (`cost_rules`, one per step kind);
  `simulate(plan, topo) -> Result(time_us, finish_us, trace, folded)`, `simulate_collective`.
- `peer_fused`: comm=shm's fused all-reduce in that simulation (the reduction inside the kernels).
- `closed_collectives`: the collectives' alpha-beta oracle and the tuner (`collective_us`,
  `choose`); `closed_form`: whole schedules from it, step by step (`plan_us`, `closed_rules`).
- `calibration`: `fit(measurements, base, world_size, cores=None) -> Topology` (its links, the
  one-way send's among them, overlap and step overheads; the device's figures from
  `calibration_device`) and `predict_ms` for the microbenchmarks the calibration experiment
  runs.
The speed benchmarks live outside the package (`python -m benchmarks.simulator`).
Units: microseconds inside (`_us`), milliseconds in results (`time_ms`), bytes, GB/s
(`_gbps`, 1e9 bytes/s), TFLOP/s. Imports only `codegen.plan` and `dsl` types from the layers
below (no runtime, no compiler): it runs anywhere.
"""

from .topology import Topology, TopologyError, load_topology  # noqa: F401
