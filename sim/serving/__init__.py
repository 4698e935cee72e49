"""The serving model: replicas, iterations, costs, weights, KV, network, workload, metrics."""
