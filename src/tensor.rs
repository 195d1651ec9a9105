//! Host element types and host tensors as the library accepts them.

use half::{bf16, f16};

use crate::precision::Dtype;

/// An element type the library accepts from the host: f32, f16 or bf16.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: Dtype;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    /// The slice as the library's tagged view.
    fn host_slice(s: &[Self]) -> HostSlice<'_>;
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    fn host_slice(s: &[Self]) -> HostSlice<'_> {
        HostSlice::F32(s)
    }
}

impl Element for f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn host_slice(s: &[Self]) -> HostSlice<'_> {
        HostSlice::F16(s)
    }
}

impl Element for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn host_slice(s: &[Self]) -> HostSlice<'_> {
        HostSlice::Bf16(s)
    }
}

/// A borrowed host tensor of one of the accepted element types.
#[derive(Debug, Clone, Copy)]
pub enum HostSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl HostSlice<'_> {
    pub fn len(&self) -> usize {
        match self {
            HostSlice::F32(s) => s.len(),
            HostSlice::F16(s) => s.len(),
            HostSlice::Bf16(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dtype(&self) -> Dtype {
        match self {
            HostSlice::F32(_) => Dtype::F32,
            HostSlice::F16(_) => Dtype::F16,
            HostSlice::Bf16(_) => Dtype::Bf16,
        }
    }
    /// Widened to f32 (exact for every accepted type).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            HostSlice::F32(s) => s.to_vec(),
            HostSlice::F16(s) => s.iter().map(|x| x.to_f32()).collect(),
            HostSlice::Bf16(s) => s.iter().map(|x| x.to_f32()).collect(),
        }
    }
    /// Converted to `dtype` with round-to-nearest-even, returned widened to f32 (what a kernel
    /// reading `dtype` sees).
    pub fn rounded_to(&self, dtype: Dtype) -> Vec<f32> {
        let v = self.to_f32_vec();
        match dtype {
            Dtype::F32 => v,
            Dtype::F16 => v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect(),
            Dtype::Bf16 => v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect(),
        }
    }
}
