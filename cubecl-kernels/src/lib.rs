//! Portable kernels of quattn, written once in CubeCL.
//!
//! This crate will hold the generic tiled online-softmax attention pipeline (FlashAttention-2
//! structure) and the quantization prepasses (INT8 Q/K, FP8, NVFP4). One source lowers to
//! WGSL/SPIR-V through wgpu and to CUDA through NVRTC. It takes plain launch parameters and does
//! not depend on the `quattn` facade.
