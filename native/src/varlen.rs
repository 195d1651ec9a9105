//! Variable-length ("varlen") batches of the f16/bf16 forward kernels, FlashAttention's packed
//! convention: the `VARLEN` variants of [`crate::wgmma`] (sm_90a, f16) and [`crate::hmma`]
//! (mma.sync, f16 and bf16).
//!
//! Q is `[total_q, q_heads, d]`, K and V `[total_k, kv_heads, d]`, O `[total_q, q_heads, d]`,
//! token-major with any row (`seq`) and head strides ([`Strides::batch`] is ignored). Sequence
//! `b` owns Q/O rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` and K/V rows `cu_seqlens_k[b] ..
//! cu_seqlens_k[b + 1]` (int32 device arrays of `batch + 1` entries, from 0, non-decreasing).
//! The optional LSE is f32 `[q_heads, total_q]` (FlashAttention-2 varlen's layout). Causal is
//! bottom-right aligned per sequence; a row that sees no key gets O = 0 and LSE = -inf. The grid
//! covers the longest sequence; blocks past a shorter sequence's end exit at once.

use crate::error::{NativeError, Result};
use crate::hmma::{check_strides, HmmaParams, MAX_SEQ_LEN};
use quattn_core::{AttentionShape, Strides};

/// Launch arguments of a varlen call. The lengths inside `cu_seqlens` live on the device; the
/// host states their totals and maxima, and [`VarlenShape::check_cu_seqlens`] checks a host
/// copy against them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VarlenShape {
    /// Sequences (`cu_seqlens_*` have `batch + 1` entries).
    pub batch: usize,
    /// Rows of Q and O (`cu_seqlens_q[batch]`).
    pub total_q: usize,
    /// Rows of K and V (`cu_seqlens_k[batch]`).
    pub total_k: usize,
    /// Longest Q and KV sequence: the grid is sized by `max_q_len`; no sequence may be longer.
    pub max_q_len: usize,
    pub max_kv_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Must equal `head_dim` (the kernels have one head dim).
    pub v_head_dim: usize,
    /// Bottom-right aligned per sequence.
    pub causal: bool,
    /// Softmax scale applied to Q·Kᵀ.
    pub scale: f32,
    /// Element strides of a token row (`seq`) and a head (`head`); `batch` is ignored.
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
    pub o: Strides,
}

/// Device addresses of one varlen launch. `lse` 0: no LSE is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VarlenPtrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
}

/// Element counts of the buffers of a varlen launch (what [`VarlenShape::required_lens`] asks
/// for, or what the caller's buffers have).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VarlenLens {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
    /// f32 elements; 0 for no LSE.
    pub lse: usize,
    /// int32 elements of each of `cu_seqlens_q` and `cu_seqlens_k`.
    pub cu_seqlens_q: usize,
    pub cu_seqlens_k: usize,
}

/// The extra kernel argument of a varlen variant: the C layout of `VarlenParams` (common.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VarlenParams {
    pub cu_q: u64,
    pub cu_k: u64,
    pub total_q: i32,
    pub pad_: i32,
}

#[cfg(feature = "cuda")]
// SAFETY: `#[repr(C)]` plain data matching `VarlenParams` of common.cuh.
unsafe impl cudarc::driver::DeviceRepr for VarlenParams {}

/// The typed entry of both varlen launchers (`launch_varlen` of [`crate::HmmaKernel`] and
/// [`crate::WgmmaKernel`]): 2-byte elements (`elem` names them in the error), the shape for
/// `head_dim`, every buffer's length against [`VarlenShape::required_lens`]; then `launch` runs
/// on the buffers' addresses while their stream guards are held.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn with_checked_ptrs<T, Q, K, V, O, L, C, D>(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    args: &VarlenShape,
    head_dim: u32,
    elem: &str,
    q: &Q,
    k: &K,
    v: &V,
    o: &mut O,
    lse: Option<&mut L>,
    cu_seqlens_q: &C,
    cu_seqlens_k: &D,
    launch: impl FnOnce(&VarlenPtrs) -> Result<()>,
) -> Result<()>
where
    Q: cudarc::driver::DevicePtr<T>,
    K: cudarc::driver::DevicePtr<T>,
    V: cudarc::driver::DevicePtr<T>,
    O: cudarc::driver::DevicePtrMut<T>,
    L: cudarc::driver::DevicePtrMut<f32>,
    C: cudarc::driver::DevicePtr<i32>,
    D: cudarc::driver::DevicePtr<i32>,
{
    if std::mem::size_of::<T>() != 2 {
        return Err(NativeError::InvalidArgs(format!("element type must be 2 bytes ({elem}), got {}", std::mem::size_of::<T>())));
    }
    args.validate(head_dim)?;
    let have = VarlenLens {
        q: q.len(),
        k: k.len(),
        v: v.len(),
        o: o.len(),
        lse: lse.as_ref().map_or(0, |l| l.len()),
        cu_seqlens_q: cu_seqlens_q.len(),
        cu_seqlens_k: cu_seqlens_k.len(),
    };
    args.check_lens(&have)?;
    if lse.as_ref().is_some_and(|l| l.len() == 0) {
        return Err(NativeError::InvalidArgs("varlen: an LSE buffer of 0 elements".into()));
    }
    let (qp, _gq) = q.device_ptr(stream);
    let (kp, _gk) = k.device_ptr(stream);
    let (vp, _gv) = v.device_ptr(stream);
    let (op, _go) = o.device_ptr_mut(stream);
    let lse = lse.map(|l| l.device_ptr_mut(stream));
    let (cq, _gcq) = cu_seqlens_q.device_ptr(stream);
    let (ck, _gck) = cu_seqlens_k.device_ptr(stream);
    let ptrs = VarlenPtrs { q: qp, k: kp, v: vp, o: op, lse: lse.as_ref().map_or(0, |(p, _)| *p), cu_seqlens_q: cq, cu_seqlens_k: ck };
    launch(&ptrs)
}

/// Row coordinates of the packed tensors are i32 in the kernels and in TMA boxes.
pub const MAX_TOTAL_ROWS: usize = i32::MAX as usize;

impl VarlenShape {
    /// Packed contiguous tensors (`[total, heads, d]`, row stride `heads * d`), scale
    /// `1/sqrt(head_dim)`.
    #[allow(clippy::too_many_arguments)]
    pub fn packed(
        batch: usize,
        total_q: usize,
        total_k: usize,
        max_q_len: usize,
        max_kv_len: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        causal: bool,
    ) -> Self {
        let rows = |heads: usize| Strides { batch: 0, head: head_dim, seq: heads * head_dim };
        VarlenShape {
            batch,
            total_q,
            total_k,
            max_q_len,
            max_kv_len,
            q_heads,
            kv_heads,
            head_dim,
            v_head_dim: head_dim,
            causal,
            scale: 1.0 / (head_dim as f32).sqrt(),
            q: rows(q_heads),
            k: rows(kv_heads),
            v: rows(kv_heads),
            o: rows(q_heads),
        }
    }

    /// Everything that needs no device memory, for a kernel of head dim `head_dim`: head dims,
    /// non-empty sizes inside the kernels' i32 rows and the grid, GQA, a finite positive scale,
    /// strides in whole 16-byte pieces.
    pub fn validate(&self, head_dim: u32) -> Result<()> {
        let bad = |m: String| Err(NativeError::InvalidArgs(format!("varlen: {m}")));
        if self.head_dim != head_dim as usize || self.v_head_dim != self.head_dim {
            return bad(format!("head dims {} / {} (V) for a kernel of head dim {head_dim}", self.head_dim, self.v_head_dim));
        }
        if self.batch == 0 || self.q_heads == 0 || self.kv_heads == 0 {
            return bad(format!("empty problem: {} sequences, {} / {} heads", self.batch, self.q_heads, self.kv_heads));
        }
        if self.total_q == 0 || self.max_q_len == 0 {
            return bad(format!("no query rows (total_q {}, max_q_len {}): nothing to launch", self.total_q, self.max_q_len));
        }
        if self.max_q_len > self.total_q || self.max_kv_len > self.total_k {
            return bad(format!(
                "longest sequences {} / {} (KV) exceed the totals {} / {}",
                self.max_q_len, self.max_kv_len, self.total_q, self.total_k
            ));
        }
        if self.max_q_len > MAX_SEQ_LEN || self.max_kv_len > MAX_SEQ_LEN {
            return bad(format!("sequence lengths {} / {} (KV) exceed {MAX_SEQ_LEN}", self.max_q_len, self.max_kv_len));
        }
        if self.total_q > MAX_TOTAL_ROWS || self.total_k > MAX_TOTAL_ROWS {
            return bad(format!("{} / {} (KV) rows exceed the i32 row index ({MAX_TOTAL_ROWS})", self.total_q, self.total_k));
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", self.q_heads, self.kv_heads));
        }
        if self.q_heads > 65535 || self.batch > 65535 {
            return bad(format!("{} sequences / {} heads exceed the grid limit 65535", self.batch, self.q_heads));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return bad(format!("softmax scale must be finite and > 0, got {}", self.scale));
        }
        for (name, st) in [("q", &self.q), ("k", &self.k), ("v", &self.v), ("o", &self.o)] {
            check_strides(name, &Strides { batch: 0, ..*st }, 8)?;
        }
        Ok(())
    }

    /// Elements each buffer must at least have (`usize::MAX` where a span overflows); LSE
    /// `q_heads * total_q` (when one is passed), `batch + 1` per `cu_seqlens`.
    pub fn required_lens(&self) -> VarlenLens {
        let span = |s: &Strides, heads: usize, rows: usize, dim: usize| {
            if rows == 0 {
                return 0;
            }
            Strides { batch: 0, ..*s }.extent(1, heads, rows, dim).unwrap_or(usize::MAX)
        };
        VarlenLens {
            q: span(&self.q, self.q_heads, self.total_q, self.head_dim),
            k: span(&self.k, self.kv_heads, self.total_k, self.head_dim),
            v: span(&self.v, self.kv_heads, self.total_k, self.v_head_dim),
            o: span(&self.o, self.q_heads, self.total_q, self.v_head_dim),
            lse: self.q_heads.saturating_mul(self.total_q),
            cu_seqlens_q: self.batch + 1,
            cu_seqlens_k: self.batch + 1,
        }
    }

    /// Checks the caller's buffer lengths: `cu_seqlens` exactly `batch + 1` entries, the
    /// tensors at least [`Self::required_lens`]; `have.lse` 0 means no LSE.
    pub fn check_lens(&self, have: &VarlenLens) -> Result<()> {
        let need = self.required_lens();
        for (name, h) in [("cu_seqlens_q", have.cu_seqlens_q), ("cu_seqlens_k", have.cu_seqlens_k)] {
            if h != self.batch + 1 {
                return Err(NativeError::InvalidArgs(format!(
                    "varlen: {name} has {h} entries, needs batch + 1 = {}",
                    self.batch + 1
                )));
            }
        }
        let pairs = [("q", have.q, need.q), ("k", have.k, need.k), ("v", have.v, need.v), ("o", have.o, need.o)];
        for (name, h, n) in pairs {
            if h < n {
                return Err(NativeError::InvalidArgs(format!("varlen: {name} has {h} elements, needs {n}")));
            }
        }
        if have.lse != 0 && have.lse < need.lse {
            return Err(NativeError::InvalidArgs(format!("varlen: lse has {} elements, needs {}", have.lse, need.lse)));
        }
        Ok(())
    }

    /// Checks a host copy of the cumulative lengths against the shape: `batch + 1` entries from
    /// 0, non-decreasing, ending at the totals, no sequence longer than the stated maxima. What
    /// the kernel relies on to stay inside each sequence's rows.
    pub fn check_cu_seqlens(&self, cu_q: &[i32], cu_k: &[i32]) -> Result<()> {
        for (name, cu, total, max) in
            [("cu_seqlens_q", cu_q, self.total_q, self.max_q_len), ("cu_seqlens_k", cu_k, self.total_k, self.max_kv_len)]
        {
            let bad = |m: String| Err(NativeError::InvalidArgs(format!("varlen: {name} {m}")));
            if cu.len() != self.batch + 1 {
                return bad(format!("has {} entries, needs batch + 1 = {}", cu.len(), self.batch + 1));
            }
            if cu[0] != 0 {
                return bad(format!("starts at {}, not 0", cu[0]));
            }
            for (b, w) in cu.windows(2).enumerate() {
                if w[1] < w[0] {
                    return bad(format!("decreases at sequence {b} ({} -> {})", w[0], w[1]));
                }
                let len = (w[1] - w[0]) as usize;
                if len > max {
                    return bad(format!("sequence {b} has {len} rows, more than the stated longest {max}"));
                }
            }
            if cu[self.batch] as usize != total {
                return bad(format!("ends at {}, not at the total {total}", cu[self.batch]));
            }
        }
        Ok(())
    }

    /// Grid `(query blocks of the longest sequence, q_heads, batch)` for `block_m` rows per CTA.
    pub fn grid(&self, block_m: u32) -> (u32, u32, u32) {
        (self.max_q_len.div_ceil(block_m as usize) as u32, self.q_heads as u32, self.batch as u32)
    }

    /// The dense shape whose `FwdParams` the varlen kernels take: lengths are the maxima,
    /// batch strides 0.
    pub(crate) fn dense_view(&self) -> AttentionShape {
        let z = |s: Strides| Strides { batch: 0, ..s };
        AttentionShape {
            batch: self.batch,
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            q_len: self.max_q_len,
            kv_len: self.max_kv_len,
            head_dim: self.head_dim,
            v_head_dim: self.v_head_dim,
            causal: self.causal,
            scale: self.scale,
            q: z(self.q),
            k: z(self.k),
            v: z(self.v),
            o: z(self.o),
            write_lse: true,
        }
    }

    /// The two kernel parameter blocks of a launch at `ptrs`.
    pub fn params(&self, ptrs: &VarlenPtrs) -> (HmmaParams, VarlenParams) {
        let p = HmmaParams::new(&self.dense_view(), [ptrs.q, ptrs.k, ptrs.v, ptrs.o, ptrs.lse]);
        let vp = VarlenParams { cu_q: ptrs.cu_seqlens_q, cu_k: ptrs.cu_seqlens_k, total_q: self.total_q as i32, pad_: 0 };
        (p, vp)
    }

    /// 16-byte aligned tensors and 4-byte aligned `cu_seqlens`; LSE 0 or 16-byte aligned.
    pub fn check_ptrs(ptrs: &VarlenPtrs) -> Result<()> {
        let named = [("q", ptrs.q, 16), ("k", ptrs.k, 16), ("v", ptrs.v, 16), ("o", ptrs.o, 16), ("lse", ptrs.lse, 16)];
        for (name, p, align) in named {
            if p % align != 0 {
                return Err(NativeError::InvalidArgs(format!("varlen: {name} pointer {p:#x} is not {align}-byte aligned")));
            }
        }
        for (name, p) in [("cu_seqlens_q", ptrs.cu_seqlens_q), ("cu_seqlens_k", ptrs.cu_seqlens_k)] {
            if p == 0 || p % 4 != 0 {
                return Err(NativeError::InvalidArgs(format!("varlen: {name} pointer {p:#x} is null or not 4-byte aligned")));
            }
        }
        for (name, p) in [("q", ptrs.q), ("k", ptrs.k), ("v", ptrs.v), ("o", ptrs.o)] {
            if p == 0 {
                return Err(NativeError::InvalidArgs(format!("varlen: {name} pointer is null")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> VarlenShape {
        // Sequences of 5 / 0 / 300 queries against 7 / 3 / 300 keys, GQA 4:2.
        VarlenShape::packed(3, 305, 310, 300, 300, 4, 2, 128, true)
    }

    #[test]
    fn params_layout_matches_the_kernel_struct() {
        assert_eq!(std::mem::size_of::<VarlenParams>(), 2 * 8 + 2 * 4);
        let s = shape();
        let ptrs = VarlenPtrs { q: 16, k: 32, v: 48, o: 64, lse: 0, cu_seqlens_q: 80, cu_seqlens_k: 96 };
        let (p, vp) = s.params(&ptrs);
        assert_eq!((p.q_len, p.kv_len, p.q_batch_stride, p.q_seq_stride, p.k_seq_stride), (300, 300, 0, 512, 256));
        assert_eq!((p.lse, p.causal, p.kv_group), (0, 1, 2));
        assert_eq!((vp.cu_q, vp.cu_k, vp.total_q), (80, 96, 305));
        assert_eq!(s.grid(128), (3, 4, 3));
    }

    #[test]
    fn lens_and_cu_seqlens_are_checked_with_typed_errors() {
        let s = shape();
        s.validate(128).unwrap();
        let need = s.required_lens();
        assert_eq!((need.q, need.k, need.o, need.lse, need.cu_seqlens_q), (305 * 512, 310 * 256, 305 * 512, 4 * 305, 4));
        s.check_lens(&need).unwrap();
        s.check_lens(&VarlenLens { lse: 0, ..need }).unwrap();
        let err = |h: VarlenLens| s.check_lens(&h).unwrap_err().to_string();
        assert!(err(VarlenLens { cu_seqlens_q: 3, ..need }).contains("cu_seqlens_q has 3 entries"));
        assert!(err(VarlenLens { cu_seqlens_k: 5, ..need }).contains("cu_seqlens_k has 5 entries"));
        assert!(err(VarlenLens { v: need.v - 1, ..need }).contains("v has"));
        assert!(err(VarlenLens { lse: 4 * 304, ..need }).contains("lse has"));
        s.check_cu_seqlens(&[0, 5, 5, 305], &[0, 7, 10, 310]).unwrap();
        let cu = |q: &[i32], k: &[i32]| s.check_cu_seqlens(q, k).unwrap_err().to_string();
        assert!(cu(&[0, 5, 305], &[0, 7, 10, 310]).contains("has 3 entries"));
        assert!(cu(&[1, 5, 5, 305], &[0, 7, 10, 310]).contains("starts at 1"));
        assert!(cu(&[0, 5, 4, 305], &[0, 7, 10, 310]).contains("decreases at sequence 1"));
        assert!(cu(&[0, 5, 5, 304], &[0, 7, 10, 310]).contains("ends at 304"));
        assert!(cu(&[0, 5, 5, 305], &[0, 7, 8, 310]).contains("sequence 2 has 302 rows"));
        assert!(matches!(s.check_cu_seqlens(&[0], &[0]), Err(NativeError::InvalidArgs(_))));
    }

    #[test]
    fn shapes_the_kernels_cannot_take_are_refused() {
        let s = shape();
        let e = |x: VarlenShape| x.validate(128).unwrap_err().to_string();
        assert!(matches!(s.validate(64), Err(NativeError::InvalidArgs(m)) if m.contains("head dim 64")));
        assert!(e(VarlenShape { v_head_dim: 64, ..s }).contains("(V)"));
        assert!(e(VarlenShape { batch: 0, ..s }).contains("empty problem"));
        assert!(e(VarlenShape { total_q: 0, max_q_len: 0, ..s }).contains("no query rows"));
        assert!(e(VarlenShape { max_kv_len: 311, ..s }).contains("exceed the totals"));
        assert!(e(VarlenShape { kv_heads: 3, ..s }).contains("not a multiple"));
        assert!(e(VarlenShape { scale: f32::NAN, ..s }).contains("scale"));
        assert!(e(VarlenShape { total_q: 1 << 31, ..s }).contains("i32 row index"));
        let mut odd = s;
        odd.k.seq = 260;
        assert!(e(odd).contains("multiples of 8"));
        // The batch stride is ignored, not checked.
        let mut b = s;
        b.q.batch = 3;
        b.validate(128).unwrap();
        let ok = VarlenPtrs { q: 16, k: 32, v: 48, o: 64, lse: 0, cu_seqlens_q: 4, cu_seqlens_k: 8 };
        VarlenShape::check_ptrs(&ok).unwrap();
        assert!(VarlenShape::check_ptrs(&VarlenPtrs { cu_seqlens_k: 0, ..ok }).is_err());
        assert!(VarlenShape::check_ptrs(&VarlenPtrs { lse: 20, ..ok }).is_err());
        assert!(VarlenShape::check_ptrs(&VarlenPtrs { o: 0, ..ok }).is_err());
    }
}
