//! Tensor maps for the TMA (Hopper's tensor memory accelerator) kernels: what a rank-4 tiled map
//! describes ([`TmaSpec`], checked against TMA's rules on the host, testable without a GPU) and,
//! with the `cuda` feature, its encoding by the driver (`cuTensorMapEncodeTiled`).
//!
//! Every map here is rank 4, `(dim, seq, head, batch)` with the head dim innermost, so one box is
//! `rows` consecutive rows of one (batch, head); the box's inner extent is one swizzle span (32, 64 or
//! 128 bytes) and TMA writes it in the 64B / 128B swizzle that the wgmma descriptors read.
//! Out-of-bounds rows (past the sequence end) arrive as zeros.

use crate::error::{NativeError, Result};
use quattn_core::Strides;

/// Registers per thread of a TMA kernel's producer and consumer warpgroups after `setmaxnreg`
/// (24 + 2 x 240 per lane of the three warpgroups fits the 64 Ki register file).
pub const WS_PRODUCER_REGS: u32 = 24;
pub const WS_CONSUMER_REGS: u32 = 240;

/// One rank-4 tiled tensor map, as `cuTensorMapEncodeTiled` takes it (dimension 0 innermost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmaSpec {
    pub addr: u64,
    /// 1 (int8 as UINT8: TMA only moves bytes) or 2 (f16).
    pub elem_bytes: u32,
    pub dims: [u64; 4],
    /// Byte strides of dimensions 1..3.
    pub strides: [u64; 3],
    pub box_dims: [u32; 4],
    /// 32, 64 or 128.
    pub swizzle_bytes: u32,
}

/// Shape of one `(dim, seq, head, batch)` tensor for [`TmaSpec::rows`].
#[derive(Clone, Copy, Debug)]
pub struct RowsTensor {
    pub addr: u64,
    pub elem_bytes: u32,
    pub head_dim: usize,
    pub len: usize,
    pub heads: usize,
    pub batch: usize,
    /// Element strides.
    pub strides: Strides,
}

impl TmaSpec {
    /// The map of a tensor whose boxes are `rows` rows x `box_inner` elements (one swizzle
    /// span of `swizzle_bytes`), from its element strides.
    pub fn rows(tensor: &'static str, t: RowsTensor, box_inner: u32, rows: u32, swizzle_bytes: u32) -> Result<Self> {
        let e = t.elem_bytes as u64;
        TmaSpec::new(
            tensor,
            t.addr,
            t.elem_bytes,
            [t.head_dim as u64, t.len as u64, t.heads as u64, t.batch as u64],
            [t.strides.seq, t.strides.head, t.strides.batch].map(|x| (x as u64).saturating_mul(e)),
            [box_inner, rows, 1, 1],
            swizzle_bytes,
        )
    }


    /// Checks TMA's rules and names the first one broken: 16-byte aligned address, dims in
    /// 1..2^32, byte strides positive multiples of 16 below 2^40, boxes of 1..256 elements per
    /// dimension with the inner box exactly one swizzle span.
    pub fn new(
        tensor: &'static str,
        addr: u64,
        elem_bytes: u32,
        dims: [u64; 4],
        strides: [u64; 3],
        box_dims: [u32; 4],
        swizzle_bytes: u32,
    ) -> Result<Self> {
        let bad = |what: String| Err(NativeError::InvalidArgs(format!("TMA map of {tensor}: {what}")));
        if !addr.is_multiple_of(16) {
            return bad(format!("address {addr:#x} is not 16-byte aligned"));
        }
        if let Some(d) = dims.iter().find(|&&d| d == 0 || d > u32::MAX as u64) {
            return bad(format!("dimension {d} outside 1..2^32"));
        }
        for (i, &x) in strides.iter().enumerate() {
            if x == 0 || x % 16 != 0 || x >= 1u64 << 40 {
                return bad(format!("byte stride {x} of dimension {} is not a positive multiple of 16 below 2^40", i + 1));
            }
        }
        if box_dims.iter().any(|&b| b == 0 || b > 256) {
            return bad(format!("box {box_dims:?} has a dimension outside 1..256"));
        }
        if box_dims[0] * elem_bytes != swizzle_bytes || ![32, 64, 128].contains(&swizzle_bytes) {
            return bad(format!("inner box of {} bytes for a {swizzle_bytes}-byte swizzle", box_dims[0] * elem_bytes));
        }
        Ok(TmaSpec { addr, elem_bytes, dims, strides, box_dims, swizzle_bytes })
    }
}

#[cfg(feature = "cuda")]
pub(crate) use launch::TmaMapCache;

#[cfg(feature = "cuda")]
mod launch {
    use cudarc::driver::{sys, DeviceRepr};

    use super::TmaSpec;
    use crate::error::Result;

    /// Three encoded maps (Q, K, V) in one kernel parameter: the C layout of `struct { TmaMap q, k, v; }`
    /// of the kernels (128-byte maps, 128-byte aligned as CUDA 13 declares `CUtensorMap`).
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct TmaMaps3 {
        q: sys::CUtensorMap,
        k: sys::CUtensorMap,
        v: sys::CUtensorMap,
    }
    // SAFETY: plain data with the kernel's layout (three 128-byte maps).
    unsafe impl DeviceRepr for TmaMaps3 {}

    impl TmaMaps3 {
        pub(crate) fn encode(specs: &[TmaSpec; 3]) -> Result<Self> {
            Ok(TmaMaps3 { q: encode(&specs[0])?, k: encode(&specs[1])?, v: encode(&specs[2])? })
        }
    }

    /// `cuTensorMapEncodeTiled` of a checked spec.
    pub(crate) fn encode(spec: &TmaSpec) -> Result<sys::CUtensorMap> {
        let data_type = if spec.elem_bytes == 1 {
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8
        } else {
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        };
        let swizzle = match spec.swizzle_bytes {
            128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        };
        let element_strides = [1u32; 4];
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        // SAFETY: every pointer addresses a local array of the rank's length; the driver only
        // writes the map.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                data_type,
                4,
                spec.addr as *mut std::ffi::c_void,
                spec.dims.as_ptr(),
                spec.strides.as_ptr(),
                spec.box_dims.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        r.result()?;
        // SAFETY: the driver filled the map (the call succeeded).
        Ok(unsafe { map.assume_init() })
    }

    /// The maps of the last launch of one kernel: a launch with the same specs (the same
    /// buffers and shapes, as in a benchmark or a training loop) skips the three driver encodes.
    #[derive(Debug, Default)]
    pub(crate) struct TmaMapCache(std::sync::Mutex<Option<([TmaSpec; 3], TmaMaps3)>>);

    impl TmaMapCache {
        pub(crate) fn maps(&self, specs: &[TmaSpec; 3]) -> Result<TmaMaps3> {
            let mut last = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some((s, maps)) = last.as_ref() {
                if s == specs {
                    return Ok(*maps);
                }
            }
            let maps = TmaMaps3::encode(specs)?;
            *last = Some((*specs, maps));
            Ok(maps)
        }
    }
}
