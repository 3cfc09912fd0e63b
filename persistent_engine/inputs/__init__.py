"""What a step runs on: the workload tensors of a point (``workloads``), realistic MoE routing
(``routing``) and each tier's input realism (``tier_inputs``). Imports nothing here; both the judge and
the executors import the modules they need."""
