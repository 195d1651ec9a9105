//! The launch arguments the native FP8 families (`wgmma_fp8`, `mma_fp8`) share: one
//! [`AttentionShape`] (sizes, strides, softmax scale, causal mask) and the descale granularity.
//! Both families take e4m3 codes in (batch, head, seq) strides with per-tensor or per-head
//! descales and the same grid; what differs (the padded Vᵀ row, parameters, buffer lengths) is
//! computed by each family's config from these arguments.

use quattn_core::{AttentionShape, DescaleGranularity};

use crate::error::{NativeError, Result};
use crate::hmma::span;

/// One FP8 launch: the shape (strides of Q, K and V count codes, which are bytes; O's count its
/// 16-bit elements) and the granularity of the f32 descales, a value being
/// `decode(code) · descale`:
/// * [`DescaleGranularity::PerTensor`]: `[1]` per tensor.
/// * [`DescaleGranularity::PerHead`]: `[batch, q_heads]` for Q, `[batch, kv_heads]` for K and V.
///
/// The kernels always write the LSE, whatever `shape.write_lse` says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Args {
    pub shape: AttentionShape,
    pub descale: DescaleGranularity,
}

/// Element counts every buffer of one launch must at least have (codes and Vᵀ in bytes, O in
/// 16-bit elements, LSE and descales in f32; `usize::MAX` where a span overflows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Lens {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    /// The family's Vᵀ scratch.
    pub vt: usize,
    pub o: usize,
    pub lse: usize,
    pub q_descale: usize,
    pub k_descale: usize,
    pub v_descale: usize,
}

impl Fp8Lens {
    /// `have` against these, buffer by buffer, as a typed error naming the first short one.
    pub fn check(&self, have: &Fp8Lens) -> Result<()> {
        let pairs = [
            ("q", self.q, have.q),
            ("k", self.k, have.k),
            ("v", self.v, have.v),
            ("vt", self.vt, have.vt),
            ("o", self.o, have.o),
            ("lse", self.lse, have.lse),
            ("q_descale", self.q_descale, have.q_descale),
            ("k_descale", self.k_descale, have.k_descale),
            ("v_descale", self.v_descale, have.v_descale),
        ];
        for (name, need, got) in pairs {
            if got < need {
                return Err(NativeError::InvalidArgs(format!("{name} has {got} elements, needs {need}")));
            }
        }
        Ok(())
    }
}

/// Device addresses of one launch (0 where a launch does not read the buffer: the attention
/// kernels read Vᵀ, not V; the Vᵀ prepasses read V and write Vᵀ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8Ptrs {
    /// e4m3 codes.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// The Vᵀ scratch of the family ([`Fp8Lens::vt`] bytes).
    pub vt: u64,
    /// f16 or bf16 (written).
    pub o: u64,
    /// f32 `[batch, q_heads, q_len]` (written).
    pub lse: u64,
    /// f32 descales.
    pub q_descale: u64,
    pub k_descale: u64,
    pub v_descale: u64,
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8LaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
}

impl Fp8Args {
    pub fn new(shape: AttentionShape, descale: DescaleGranularity) -> Self {
        Fp8Args { shape, descale }
    }

    /// Descales of Q and of K (or V) the granularity takes.
    pub fn descale_counts(&self) -> (usize, usize) {
        let s = &self.shape;
        match self.descale {
            DescaleGranularity::PerTensor => (1, 1),
            DescaleGranularity::PerHead | DescaleGranularity::PerBlock => (s.batch * s.q_heads, s.batch * s.kv_heads),
        }
    }

    /// Minimum lengths of every buffer, with `vt` bytes of the family's Vᵀ scratch.
    pub fn lens(&self, vt: usize) -> Fp8Lens {
        let s = &self.shape;
        let d = s.head_dim;
        let (q_descale, kv_descale) = self.descale_counts();
        Fp8Lens {
            q: span(&s.q, s.batch, s.q_heads, s.q_len, d),
            k: span(&s.k, s.batch, s.kv_heads, s.kv_len, d),
            v: span(&s.v, s.batch, s.kv_heads, s.kv_len, d),
            vt,
            o: span(&s.o, s.batch, s.q_heads, s.q_len, d),
            lse: s.lse_len(),
            q_descale,
            k_descale: kv_descale,
            v_descale: kv_descale,
        }
    }

    /// The checks every native FP8 launch shares, for a kernel of head dim `head_dim`.
    /// `keys_i32` is the longest key row the device indexes in i32 (the family's padded Vᵀ row);
    /// `empty_kv` says whether `kv_len == 0` is legal. Code strides (Q, K, V) must be multiples
    /// of 16 elements (16-byte copies of 8-bit rows), O's of 8 (16-byte stores of 16-bit
    /// elements).
    pub(crate) fn check(&self, head_dim: u32, keys_i32: usize, empty_kv: bool) -> Result<()> {
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        let s = &self.shape;
        if self.descale == DescaleGranularity::PerBlock {
            return bad("per-block descales are not supported by this family (per tensor or per head)".into());
        }
        if s.head_dim != head_dim as usize || s.v_head_dim != s.head_dim {
            return bad(format!("head dims {} / {} (V) for a kernel of head dim {head_dim}", s.head_dim, s.v_head_dim));
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 || (s.kv_len == 0 && !empty_kv) {
            return bad(format!(
                "empty problem: batch {}, heads {}/{}, lengths {}/{}",
                s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len
            ));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", s.q_heads, s.kv_heads));
        }
        if s.q_len > i32::MAX as usize || keys_i32 > i32::MAX as usize {
            return bad("sequence length exceeds i32".into());
        }
        if s.q_heads > 65535 || s.batch > 65535 {
            return bad(format!("batch {} / heads {} exceed the grid limit 65535", s.batch, s.q_heads));
        }
        if !(s.scale.is_finite() && s.scale > 0.0) {
            return bad(format!("softmax scale must be finite and > 0, got {}", s.scale));
        }
        for (name, st, align) in [("q", &s.q, 16), ("k", &s.k, 16), ("v", &s.v, 16), ("o", &s.o, 8)] {
            if st.to_array().iter().any(|&x| x % align != 0 || x > i64::MAX as usize) {
                return bad(format!("{name} strides {st:?} must be multiples of {align} elements below 2^63"));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
pub use buffers::Fp8Buffers;

#[cfg(feature = "cuda")]
mod buffers {
    use cudarc::driver::{DevicePtr, DevicePtrMut};

    use super::Fp8Lens;

    /// Typed buffers of one launch of either family: `u8` e4m3 codes for Q, K, V and the Vᵀ
    /// scratch (written by the family's prepass), 2-byte `T` (f16 or bf16 bits, per the config's
    /// O type) for O, f32 for the LSE and the descales.
    pub struct Fp8Buffers<'a, T, Q, K, V, VT, O, L, S> {
        pub q: &'a Q,
        pub k: &'a K,
        pub v: &'a V,
        pub vt: &'a mut VT,
        pub o: &'a mut O,
        pub lse: &'a mut L,
        pub q_descale: &'a S,
        pub k_descale: &'a S,
        pub v_descale: &'a S,
        pub _elem: std::marker::PhantomData<T>,
    }

    impl<'a, T, Q, K, V, VT, O, L, S> Fp8Buffers<'a, T, Q, K, V, VT, O, L, S>
    where
        Q: DevicePtr<u8>,
        K: DevicePtr<u8>,
        V: DevicePtr<u8>,
        VT: DevicePtrMut<u8>,
        O: DevicePtrMut<T>,
        L: DevicePtrMut<f32>,
        S: DevicePtr<f32>,
    {
        #[allow(clippy::too_many_arguments)]
        pub fn new(
            q: &'a Q,
            k: &'a K,
            v: &'a V,
            vt: &'a mut VT,
            o: &'a mut O,
            lse: &'a mut L,
            q_descale: &'a S,
            k_descale: &'a S,
            v_descale: &'a S,
        ) -> Self {
            Fp8Buffers { q, k, v, vt, o, lse, q_descale, k_descale, v_descale, _elem: std::marker::PhantomData }
        }

        /// The element counts the buffers hold.
        pub fn lens(&self) -> Fp8Lens {
            Fp8Lens {
                q: self.q.len(),
                k: self.k.len(),
                v: self.v.len(),
                vt: self.vt.len(),
                o: self.o.len(),
                lse: self.lse.len(),
                q_descale: self.q_descale.len(),
                k_descale: self.k_descale.len(),
                v_descale: self.v_descale.len(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::{Layout, Strides};

    #[test]
    fn lens_and_checks() {
        let mut s = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 777, 128, true);
        s.o = Strides::new(Layout::Bshd, 8, 1000, 128);
        let a = Fp8Args::new(s, DescaleGranularity::PerHead);
        let l = a.lens(5);
        assert_eq!((l.q, l.k, l.o, l.lse, l.vt), (2 * 8 * 1000 * 128, 2 * 2 * 777 * 128, 2 * 8 * 1000 * 128, 2 * 8 * 1000, 5));
        assert_eq!((l.q_descale, l.k_descale, l.v_descale), (16, 4, 4));
        assert_eq!(Fp8Args { descale: DescaleGranularity::PerTensor, ..a }.lens(0).q_descale, 1);
        let mut have = l;
        have.v_descale -= 1;
        assert!(l.check(&have).unwrap_err().to_string().contains("v_descale"));
        l.check(&l).unwrap();
        a.check(128, 896, false).unwrap();
        assert!(a.check(64, 896, false).is_err(), "head dim of another kernel");
        assert!(Fp8Args { descale: DescaleGranularity::PerBlock, ..a }.check(128, 896, false).is_err());
        let with = |f: &dyn Fn(&mut AttentionShape)| {
            let mut x = a;
            f(&mut x.shape);
            x.check(128, 896, false)
        };
        assert!(with(&|s| s.kv_heads = 3).is_err());
        assert!(with(&|s| s.scale = 0.0).is_err());
        assert!(with(&|s| s.v_head_dim = 64).is_err());
        assert!(with(&|s| s.q.seq = 136).is_err(), "code strides in 16-byte pieces");
        assert!(with(&|s| s.o.seq = 136).is_ok(), "O strides in 16-byte pieces of 16-bit elements");
        assert!(with(&|s| s.kv_len = 0).is_err());
        let mut empty = a;
        empty.shape.kv_len = 0;
        empty.check(128, 128, true).unwrap();
    }
}
