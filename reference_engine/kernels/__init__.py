"""The engine's kernels: the model's hot-path operations in plain torch (`ops.TorchOps`, the reference the
others are checked against, and `attention`'s paged attention), their Triton versions for CUDA (`triton_ops`,
`triton_kernels`), the C kernels for the CPU (`cpu_kernels`, sources in `csrc/`), oneDNN-packed CPU linears
(`cpu_linear`), and `dispatch.ops_for`, which picks one for a device. Nothing here imports the engine core."""
