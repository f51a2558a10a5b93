"""The real engine: the simulator's scheduler and allocators driving real kernels on a device."""
