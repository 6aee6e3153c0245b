"""The cost model (later issues): simulate a Plan on a Topology (SimPy), closed-form oracle."""
