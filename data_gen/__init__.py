"""GPU benchmarking: the Triton GEMM config sweep and the pad sweep, writing dataset shards."""
