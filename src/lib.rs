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
pub mod precision;
pub mod problem;

pub use device::{Device, NativeKind, PortableKind, Strategy, WgpuAdapter};
pub use error::{Error, Result, TensorName};
pub use precision::{
    DescaleGranularity, Dtype, Fp8Format, Int8Granularity, Nvfp4V, Precision, PvAccum, PvFormat, QkAccum,
};
pub use problem::{AttentionProblem, AttentionShape, Layout, Strides, TensorStrides};
pub use session::{attention, DeviceInfo, Output, Path, Plan, Resident, Session};
pub use tensor::{Element, HostSlice};

mod backend;
pub mod inputs;
pub mod metrics;
pub mod reference;
pub mod session;
pub mod tensor;
