//! # quattn
//!
//! Fast, low-precision attention (the forward pass of tiled online-softmax "flash" attention).
//! Kernels are written once in CubeCL and run through wgpu and CUDA; where the device matches, a
//! native layer swaps in hand-written tensor-core kernels.
//!
//! The facade: describe the shapes with [`AttentionProblem`], choose what is computed with
//! [`Precision`], open a [`Session`] on a [`Device`] and run. An independent f64 reference
//! ([`reference`]), bit-exact codecs ([`codec`]), CPU emulations of every mode ([`emulation`])
//! and error metrics ([`metrics`]) come with it.

pub mod codec;
pub mod device;
pub mod emulation;
pub mod error;
pub mod merge;
pub mod fuzz;
pub mod precision;
pub mod problem;

pub use device::{Device, NativeKind, PortableKind, Strategy, WgpuAdapter};
pub use error::{Error, Result, TensorName};
pub use merge::{merge_outputs, merge_states, merge_states_into, MergedState};
pub use quattn_core::TWO_STAGE_CHUNK;
pub use precision::{
    DescaleGranularity, Dtype, Fp8Format, Int8Granularity, Nvfp4V, Precision, PvAccum, PvFormat, QkAccum,
};
pub use device_tensor::{CubeclTensors, Fp4ScaleLayout, Fp4Tensors, Fp8Descales};
#[cfg(feature = "cuda")]
pub use device_tensor::{CudaCodes, CudaCodesMut, CudaFp8, CudaFp8Mut, CudaTensor, CudaTensorMut};
#[cfg(feature = "hip")]
pub use device_tensor::{HipTensor, HipTensorMut};
pub use registry::{Family, KernelId, NativeChoice};
pub use paged::{PagedKv, PAGE_SIZES};
pub use varlen::VarLen;
pub use problem::{AttentionProblem, AttentionShape, CausalAlign, Layout, Strides, TensorStrides, Window};
pub use session::{attention, DeviceInfo, Output, Path, Plan, Resident, Session};
pub use tensor::{Element, HostSlice};

/// The cudarc the CUDA entry points take (`CudaSlice`, `CudaStream`): use this one so the
/// versions match.
#[cfg(feature = "cuda")]
pub use cudarc;
/// The CubeCL the portable kernels and [`Session::run_cubecl`] use (handles, clients, runtimes).
pub use cubecl;

/// The README's Rust blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod backend;
pub mod device_tensor;
pub mod registry;
pub mod inputs;
pub mod metrics;
pub mod nonfinite;
pub mod paged;
pub mod varlen;
pub mod reference;
pub mod session;
pub mod tensor;
