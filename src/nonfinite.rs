//! The NaN policy of the host entry points ([`Session::run`], [`Session::upload`] /
//! [`Session::download`]), the same on every backend and kernel family:
//!
//! * A query row whose softmax sees a NaN or ±inf (in its own Q row, or in the K or V row of a
//!   key it sees after the mask: causal, sliding window) comes out NaN: every element of its O
//!   row and its LSE.
//! * Every other row is computed as if the non-finite values were 0, which it multiplies by a
//!   zero probability or never reads: it is what it would be without them. In the quantized
//!   modes (INT8, FP8) a non-finite value counts as 0 in the scale statistics (amax, K mean) of
//!   its block, so the rows of that block see the quantization those finite values give.
//! * A row that sees no key (causal with `q_len > kv_len`, a window holding no key) has `O = 0`
//!   and `LSE = -inf`, also when its own Q row holds a NaN (and with attention sinks): no
//!   arithmetic touches it.
//! * A finite input that the plan's element type cannot hold (an f32 of 1e5 planned in f16) is
//!   [`Error::InputOverflow`] naming the tensor, the index and the value, before anything runs.
//! * Rows whose inputs are all finite but whose output is not (an f16 accumulator or an f32
//!   score overflowed) are [`Error::Overflow`] after the call, instead of silent infinities.
//!
//! How this differs from a naive IEEE computation (PyTorch's, or [`crate::reference`]): there a
//! NaN in channel `c` of a V row spreads only to channel `c` of the rows that see it, an
//! infinite score of `-inf` drops its key like a mask, and `+inf` or `inf − inf` make the row
//! NaN. The set of rows that can change is the same; the policy makes every changed row NaN, on
//! every kernel alike. The kernels cannot be trusted to carry NaN on their own: WGSL lets the
//! compiler assume there are none, `max` drops a NaN operand on CUDA, and a masked key's zero
//! probability times a NaN in V is NaN in rows that do not see the key. So the host path hands
//! the kernels finite values and applies the rule itself. The device-tensor entry points
//! ([`Session::run_cubecl`], [`Session::run_cuda`]) read the caller's buffers as they are and
//! give what each kernel's arithmetic gives; the portable FP8 kernel applies the same rule to
//! non-finite codes on the device.
//!
//! [`Session::run`]: crate::Session::run
//! [`Session::upload`]: crate::Session::upload
//! [`Session::download`]: crate::Session::download
//! [`Session::run_cubecl`]: crate::Session::run_cubecl
//! [`Session::run_cuda`]: crate::Session::run_cuda

use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::precision::Dtype;
use crate::problem::{Layout, Strides};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Precision, TensorName};

/// Elements per task of the parallel scans.
const CHUNK: usize = 1 << 15;

/// What screening the inputs found: copies with the non-finite values zeroed (only for the
/// tensors that held some) and the rows they poison.
pub(crate) struct Screened {
    pub(crate) q: Option<Owned>,
    pub(crate) k: Option<Owned>,
    pub(crate) v: Option<Owned>,
    pub(crate) poison: Option<Poison>,
}

/// A host tensor the screen copied.
pub(crate) enum Owned {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Owned {
    pub(crate) fn slice(&self) -> HostSlice<'_> {
        match self {
            Owned::F32(v) => HostSlice::F32(v),
            Owned::F16(v) => HostSlice::F16(v),
            Owned::Bf16(v) => HostSlice::Bf16(v),
        }
    }
}

/// The rows that see a non-finite input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Poison {
    /// Q rows holding one, as their LSE index ([`AttentionProblem::lse_index`]), sorted.
    q_rows: Vec<usize>,
    /// Per `b · kv_heads + kv_head`: the keys whose K or V row holds one, sorted. A row sees
    /// a contiguous range of keys (`AttentionProblem::visible_range`), so one search decides.
    bad_keys: Vec<Vec<usize>>,
}

impl Poison {
    /// Whether query row `(b, h, i)` sees a non-finite input (rows that see no key never do);
    /// `seq` is sequence `b`'s view ([`AttentionProblem::sequence`]).
    fn poisons(&self, p: &AttentionProblem, seq: &AttentionProblem, b: usize, h: usize, i: usize) -> bool {
        let visible = seq.visible_range(i);
        if visible.is_empty() {
            return false;
        }
        let r = p.lse_index(b, h, i);
        let sees_bad_key = self.bad_keys.get(b * p.kv_heads + p.kv_head_of(h)).is_some_and(|keys| {
            let first = keys.partition_point(|&j| j < visible.start);
            keys.get(first).is_some_and(|&j| j < visible.end)
        });
        sees_bad_key || self.q_rows.binary_search(&r).is_ok()
    }
}

/// How an element fares on its way into the plan's element type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Fine,
    NonFinite,
    /// Finite, but beyond the target type's range.
    Overflow,
}

/// Classifies one element of `x` (widened to f32, exact for every host type) for `target`.
fn classify(x: f32, target: Dtype) -> Class {
    if !x.is_finite() {
        return Class::NonFinite;
    }
    let overflows = match target {
        Dtype::F32 => false,
        Dtype::F16 => f16::from_f32(x).is_infinite(),
        Dtype::Bf16 => bf16::from_f32(x).is_infinite(),
    };
    if overflows {
        Class::Overflow
    } else {
        Class::Fine
    }
}

/// The largest magnitude that surely converts to a finite `target` value (the fast path's
/// bound; values above it are classified exactly).
fn sure_bound(target: Dtype) -> f32 {
    match target {
        Dtype::F32 => f32::MAX,
        Dtype::F16 => f16::MAX.to_f32(),
        Dtype::Bf16 => bf16::MAX.to_f32(),
    }
}

/// Whether every element of the buffer surely converts to a finite `target` value: one
/// branch-free pass (NaN fails the comparison). Elements outside a strided view count too, so
/// `false` only sends the tensor to the exact per-row scan.
fn all_fine(x: HostSlice<'_>, target: Dtype) -> bool {
    let bound = sure_bound(target);
    match x {
        HostSlice::F32(s) => s.par_chunks(CHUNK).all(|c| c.iter().fold(true, |a, v| a & (v.abs() <= bound))),
        // Every finite f16 fits every target: only the exponent bits matter.
        HostSlice::F16(s) => s.par_chunks(CHUNK).all(|c| c.iter().fold(true, |a, v| a & (v.to_bits() & 0x7c00 != 0x7c00))),
        HostSlice::Bf16(s) => s.par_chunks(CHUNK).all(|c| c.iter().fold(true, |a, v| a & (v.to_f32().abs() <= bound))),
    }
}

fn element(x: HostSlice<'_>, i: usize) -> f32 {
    match x {
        HostSlice::F32(s) => s[i],
        HostSlice::F16(s) => s[i].to_f32(),
        HostSlice::Bf16(s) => s[i].to_f32(),
    }
}

/// One tensor's view: its strides and sizes.
#[derive(Clone, Copy)]
struct View {
    tensor: TensorName,
    strides: Strides,
    heads: usize,
    seq: usize,
    dim: usize,
}

/// The rows of `x` (as `(b · heads + h) · seq + s`) holding a non-finite element, and a copy
/// with those elements zeroed when there are any; [`Error::InputOverflow`] for the first (lowest
/// index) finite element the target type cannot hold.
fn screen_tensor(x: HostSlice<'_>, view: View, batch: usize, target: Dtype) -> Result<(Vec<usize>, Option<Owned>)> {
    if all_fine(x, target) {
        return Ok((Vec::new(), None));
    }
    let View { tensor, strides, heads, seq, dim } = view;
    // Per row: whether it holds a non-finite element, and its first overflowing element.
    let rows: Vec<(bool, Option<(usize, f32)>)> = (0..batch * heads * seq)
        .into_par_iter()
        .map(|r| {
            let off = strides.offset(r / (heads * seq), (r / seq) % heads, r % seq);
            let mut bad = false;
            for i in off..off + dim {
                let value = element(x, i);
                match classify(value, target) {
                    Class::Fine => {}
                    Class::NonFinite => bad = true,
                    Class::Overflow => return (bad, Some((i, value))),
                }
            }
            (bad, None)
        })
        .collect();
    if let Some((index, value)) = rows.iter().filter_map(|r| r.1).min_by_key(|r| r.0) {
        return Err(Error::InputOverflow { tensor, index, value, dtype: target });
    }
    let bad: Vec<usize> = rows.iter().enumerate().filter(|(_, r)| r.0).map(|(i, _)| i).collect();
    if bad.is_empty() {
        return Ok((bad, None));
    }
    let mut owned = match x {
        HostSlice::F32(s) => Owned::F32(s.to_vec()),
        HostSlice::F16(s) => Owned::F16(s.to_vec()),
        HostSlice::Bf16(s) => Owned::Bf16(s.to_vec()),
    };
    for &r in &bad {
        let off = strides.offset(r / (heads * seq), (r / seq) % heads, r % seq);
        let range = off..off + dim;
        match &mut owned {
            Owned::F32(v) => v[range].iter_mut().filter(|a| !a.is_finite()).for_each(|a| *a = 0.0),
            Owned::F16(v) => v[range].iter_mut().filter(|a| !a.is_finite()).for_each(|a| *a = f16::ZERO),
            Owned::Bf16(v) => v[range].iter_mut().filter(|a| !a.is_finite()).for_each(|a| *a = bf16::ZERO),
        }
    }
    Ok((bad, Some(owned)))
}

/// Screens Q, K and V (of lengths already checked against the problem) for a plan computing on
/// `precision`: overflow of its input type is an error, non-finite values are zeroed in copies
/// and the rows that see them recorded.
pub(crate) fn screen(p: &AttentionProblem, precision: Precision, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<Screened> {
    let target = precision.input_dtype();
    let s = p.tensor_strides();
    let view = |tensor, strides, heads, seq, dim| View { tensor, strides, heads, seq, dim };
    // A variable-length batch is screened as one entry of `total` packed rows: the row numbers
    // come out as `h · total_q + packed row`, its LSE index.
    let (batch, q_seq, k_seq) = p.tensor_rows();
    let (q_rows, q) = screen_tensor(q, view(TensorName::Q, s.q, p.q_heads, q_seq, p.head_dim), batch, target)?;
    // A paged pool is screened as one sequence of `num_pages · page_size` rows (BSHD), whose
    // bad rows are then found in the sequences that read them.
    let (kv_batch, kv_seq, ks, vs) = match &p.paged {
        Some(pg) => {
            let rows = pg.num_pages * pg.page_size;
            (1, rows, Strides::new(Layout::Bshd, p.kv_heads, rows, p.head_dim), Strides::new(Layout::Bshd, p.kv_heads, rows, p.v_head_dim))
        }
        None => (batch, k_seq, s.k, s.v),
    };
    let (k_rows, k) = screen_tensor(k, view(TensorName::K, ks, p.kv_heads, kv_seq, p.head_dim), kv_batch, target)?;
    let (v_rows, v) = screen_tensor(v, view(TensorName::V, vs, p.kv_heads, kv_seq, p.v_head_dim), kv_batch, target)?;
    let poison = if q_rows.is_empty() && k_rows.is_empty() && v_rows.is_empty() {
        None
    } else {
        let mut bad_keys = vec![Vec::new(); p.batch * p.kv_heads];
        match (&p.paged, &p.varlen) {
            (None, Some(vl)) => {
                // r = kv_head · total_k + packed row
                for r in k_rows.into_iter().chain(v_rows) {
                    if let Some((b, j)) = vl.key_of_row(r % kv_seq) {
                        bad_keys[b * p.kv_heads + r / kv_seq].push(j);
                    }
                }
            }
            (None, None) => {
                for r in k_rows.into_iter().chain(v_rows) {
                    // r = (b · kv_heads + kv_head) · kv_len + key
                    bad_keys[r / p.kv_len].push(r % p.kv_len);
                }
            }
            (Some(pg), _) => {
                // r = kv_head · (num_pages · page_size) + pool row
                let mut heads_of_row: std::collections::HashMap<usize, Vec<usize>> = Default::default();
                for r in k_rows.into_iter().chain(v_rows) {
                    heads_of_row.entry(r % kv_seq).or_default().push(r / kv_seq);
                }
                for b in 0..p.batch {
                    for j in 0..pg.seq_len(b) {
                        for &kh in heads_of_row.get(&pg.slot(b, j)).into_iter().flatten() {
                            bad_keys[b * p.kv_heads + kh].push(j);
                        }
                    }
                }
            }
        }
        for keys in &mut bad_keys {
            keys.sort_unstable();
            keys.dedup();
        }
        Some(Poison { q_rows, bad_keys })
    };
    Ok(Screened { q, k, v, poison })
}

/// Applies the policy to a call's output: poisoned rows become NaN (O row and LSE); any other
/// row that sees a key and came out non-finite is [`Error::Overflow`].
pub(crate) fn finish(p: &AttentionProblem, precision: Precision, kernel: &str, poison: Option<&Poison>, o: &mut [f32], mut lse: Option<&mut [f32]>) -> Result<()> {
    let os = p.o_strides();
    let dv = p.v_head_dim;
    let rows = p.batch * p.q_heads * p.q_len;
    if o.len() < p.o_len_elems() || lse.as_deref().is_some_and(|l| l.len() < p.lse_len_elems()) {
        return Err(Error::Kernel { kernel: kernel.to_string(), reason: format!("read back {} O elements for {}", o.len(), p.o_len_elems()) });
    }
    // Rows as (b, h, i); a variable-length batch's rows past a shorter sequence's end do not
    // exist and are never visited.
    let coords = |r: usize| (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
    // Each sequence's view once (its own lengths), not once per row.
    let seqs: Vec<std::borrow::Cow<'_, AttentionProblem>> = (0..p.batch).map(|b| p.sequence(b)).collect();
    let exists = |r: usize| {
        let (b, _, i) = coords(r);
        p.has_q_row(b, i)
    };
    let o_offset = |b: usize, h: usize, i: usize| {
        let (ob, oi) = p.q_position(b, i);
        os.offset(ob, h, oi)
    };
    if let Some(poison) = poison {
        for r in (0..rows).filter(|&r| exists(r)) {
            let (b, h, i) = coords(r);
            if poison.poisons(p, &seqs[b], b, h, i) {
                let off = o_offset(b, h, i);
                o[off..off + dv].fill(f32::NAN);
                if let Some(l) = lse.as_deref_mut() {
                    l[p.lse_index(b, h, i)] = f32::NAN;
                }
            }
        }
    }
    let lse = lse.as_deref();
    let overflowed = |r: usize| -> bool {
        let (b, h, i) = coords(r);
        if !p.has_q_row(b, i) || seqs[b].visible_keys(i) == 0 || poison.is_some_and(|x| x.poisons(p, &seqs[b], b, h, i)) {
            return false;
        }
        let off = o_offset(b, h, i);
        o[off..off + dv].iter().any(|x| !x.is_finite()) || lse.is_some_and(|l| !l[p.lse_index(b, h, i)].is_finite())
    };
    let (count, first) = (0..rows)
        .into_par_iter()
        .filter(|&r| overflowed(r))
        .fold(|| (0usize, usize::MAX), |(n, f), r| (n + 1, f.min(r)))
        .reduce(|| (0, usize::MAX), |a, b| (a.0 + b.0, a.1.min(b.1)));
    if count > 0 {
        let (batch, head, row) = coords(first);
        return Err(Error::Overflow { kernel: kernel.to_string(), precision, rows: count, batch, head, row });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_follows_the_target_range() {
        assert!(classify(65504.0, Dtype::F16) == Class::Fine);
        // 65519 rounds down to 65504, 65520 rounds to inf.
        assert!(classify(65519.0, Dtype::F16) == Class::Fine);
        assert!(classify(65520.0, Dtype::F16) == Class::Overflow);
        assert!(classify(-1e5, Dtype::F16) == Class::Overflow);
        assert!(classify(1e5, Dtype::Bf16) == Class::Fine);
        assert!(classify(f32::MAX, Dtype::F32) == Class::Fine);
        assert!(classify(f32::MAX, Dtype::Bf16) == Class::Overflow);
        for t in Dtype::ALL {
            assert!(classify(f32::NAN, t) == Class::NonFinite);
            assert!(classify(f32::NEG_INFINITY, t) == Class::NonFinite);
        }
    }

    #[test]
    fn strided_padding_is_not_screened() {
        // Rows of 2 elements every 3: the padding element may hold anything.
        let p = AttentionProblem::new(1, 1, 2, 2);
        let st = Strides { batch: 6, head: 6, seq: 3 };
        let x = [1.0f32, 2.0, f32::NAN, 3.0, 4.0, 1e9];
        let view = View { tensor: TensorName::Q, strides: st, heads: 1, seq: 2, dim: 2 };
        let (rows, copy) = screen_tensor(HostSlice::F32(&x), view, p.batch, Dtype::F16).unwrap();
        assert!(rows.is_empty() && copy.is_none());
        let y = [1.0f32, f32::INFINITY, 0.0, 3.0, 1e5, 0.0];
        match screen_tensor(HostSlice::F32(&y), view, p.batch, Dtype::F16) {
            Err(Error::InputOverflow { tensor: TensorName::Q, index: 4, .. }) => {}
            r => panic!("{:?}", r.map(|r| r.0)),
        }
        let z = [1.0f32, f32::INFINITY, 7.0, 3.0, 4.0, 7.0];
        let (rows, copy) = screen_tensor(HostSlice::F32(&z), view, p.batch, Dtype::F16).unwrap();
        assert_eq!(rows, vec![0]);
        match copy {
            Some(Owned::F32(c)) => assert_eq!(c, vec![1.0, 0.0, 7.0, 3.0, 4.0, 7.0]),
            _ => panic!("expected an f32 copy"),
        }
    }

    #[test]
    fn causal_poison_starts_at_the_first_bad_key() {
        // q_len 4, kv_len 6, causal: row i sees keys 0..=i+2.
        let p = AttentionProblem::new(1, 2, 4, 8).kv_heads(1).kv_len(6).causal(true);
        let poison = Poison { q_rows: vec![4 + 1], bad_keys: vec![vec![4]] };
        let seen: Vec<bool> = (0..2).flat_map(|h| (0..4).map(move |i| (h, i))).map(|(h, i)| poison.poisons(&p, &p, 0, h, i)).collect();
        // Head 0: rows 2 and 3 see key 4. Head 1: the same, plus row 1's own Q.
        assert_eq!(seen, vec![false, false, true, true, false, true, true, true]);
    }
}
