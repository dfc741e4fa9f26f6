"""What is read of the GPUs: NVML (devices, per-process use, health), the CUDA device map of each
rank, and the kernel's NVIDIA Xid messages."""
