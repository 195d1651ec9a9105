//! Native fast paths of quattn.
//!
//! This crate will hold hand-written tensor-core attention kernels (`native/cuda/*.cu`), compiled
//! at run time with NVRTC through cudarc for the exact device: mma.sync HMMA FP16 kernels, INT8
//! Q/K kernels (IMMA, tcgen05 UMMA on sm_100a), FP8 and NVFP4 block-scale kernels. It takes plain
//! launch parameters and does not depend on the `quattn` facade.
