//! Merging attention states by their log-sum-exp (FlashInfer's `merge_state`).
//!
//! A state is, per query row, the attention output `o` over some set of keys (normalized over
//! that set) and `lse`, the natural log of that set's softmax denominator (the LSE every quattn
//! kernel returns). For two disjoint key sets A and B, attention over A ∪ B is
//!
//! ```text
//! lse = ln(exp(lse_a) + exp(lse_b)),   o = exp(lse_a - lse) · o_a + exp(lse_b - lse) · o_b
//! ```
//!
//! which is how split-KV decode combines its splits, how chunked prefill attends a new chunk to a
//! cached prefix, and how ring attention combines the blocks of other devices. Computed with the
//! larger LSE factored out (no exponent overflows), in f64, rounded once to f32. A state with
//! `lse = -inf` (the row saw no key) weighs nothing and its `o` is never read, so a row that
//! sees no key in either state gets `o = 0` and `lse = -inf`, never NaN.

use crate::error::{Error, Result, TensorName};
use crate::problem::AttentionProblem;
use crate::session::Output;

/// The merged state: `o` with the inputs' layout, one `lse` per row.
#[derive(Debug, Clone, PartialEq)]
pub struct MergedState {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
}

/// Weights of the two states of one row, and the merged LSE; `None` when neither state saw a
/// key.
fn weights(la: f32, lb: f32) -> Option<(f64, f64, f32)> {
    let (la, lb) = (la as f64, lb as f64);
    let m = la.max(lb);
    if m == f64::NEG_INFINITY {
        return None;
    }
    let (wa, wb) = ((la - m).exp(), (lb - m).exp());
    let w = wa + wb;
    Some((wa / w, wb / w, (m + w.ln()) as f32))
}

/// Merges one row: `o_a` and `lse_a` become the state over both key sets.
fn merge_row(o_a: &mut [f32], lse_a: &mut f32, o_b: &[f32], lse_b: f32) {
    match weights(*lse_a, lse_b) {
        None => {
            o_a.iter_mut().for_each(|x| *x = 0.0);
            *lse_a = f32::NEG_INFINITY;
        }
        Some((wa, wb, lse)) => {
            for (x, &y) in o_a.iter_mut().zip(o_b) {
                // A zero weight skips its term: an empty state's O may hold anything.
                let a = if wa == 0.0 { 0.0 } else { wa * *x as f64 };
                let b = if wb == 0.0 { 0.0 } else { wb * y as f64 };
                *x = (a + b) as f32;
            }
            *lse_a = lse;
        }
    }
}

/// An LSE is finite or `-inf` (a row that saw no key); `+inf` and NaN are refused.
fn check_lse(lse: &[f32]) -> Result<()> {
    match lse.iter().position(|l| l.is_nan() || *l == f32::INFINITY) {
        Some(index) => Err(Error::InvalidLse { index, value: lse[index] }),
        None => Ok(()),
    }
}

/// Head dim of a state whose `o` holds one row of `d` values per `lse` entry.
fn row_len(o: &[f32], lse: &[f32]) -> Result<usize> {
    if lse.is_empty() {
        return if o.is_empty() {
            Ok(0)
        } else {
            Err(Error::ShapeMismatch { tensor: TensorName::Output, expected: vec![0], got: vec![o.len()] })
        };
    }
    if !o.len().is_multiple_of(lse.len()) || o.is_empty() {
        return Err(Error::ShapeMismatch { tensor: TensorName::Output, expected: vec![lse.len(), o.len() / lse.len()], got: vec![o.len()] });
    }
    Ok(o.len() / lse.len())
}

/// Merges state B into state A in place. Row `r` of a state is `o[r·d .. (r+1)·d]` with
/// `lse[r]`, `d = o.len() / lse.len()` (a quattn output in [`Layout::Bhsd`] and its LSE are in
/// this order; [`merge_outputs`] takes any layout). Typed errors for lengths that do not match
/// and for an LSE that is NaN or `+inf`.
///
/// [`Layout::Bhsd`]: crate::Layout::Bhsd
pub fn merge_states_into(o_a: &mut [f32], lse_a: &mut [f32], o_b: &[f32], lse_b: &[f32]) -> Result<()> {
    let d = row_len(o_a, lse_a)?;
    if lse_b.len() != lse_a.len() {
        return Err(Error::BufferLength { tensor: TensorName::Lse, expected: lse_a.len(), got: lse_b.len() });
    }
    if o_b.len() != o_a.len() {
        return Err(Error::BufferLength { tensor: TensorName::Output, expected: o_a.len(), got: o_b.len() });
    }
    check_lse(lse_a)?;
    check_lse(lse_b)?;
    if d == 0 {
        return Ok(());
    }
    for (r, (oa, ob)) in o_a.chunks_exact_mut(d).zip(o_b.chunks_exact(d)).enumerate() {
        merge_row(oa, &mut lse_a[r], ob, lse_b[r]);
    }
    Ok(())
}

/// The state over the union of two disjoint key sets from the states over each
/// (FlashInfer's `merge_state(v_a, s_a, v_b, s_b)`); rows as in [`merge_states_into`].
///
/// ```
/// // One row, head dim 2: the same logits on both sides weigh the two outputs equally.
/// let m = quattn::merge_states(&[1.0, 0.0], &[0.5], &[0.0, 1.0], &[0.5])?;
/// assert_eq!(m.o, vec![0.5, 0.5]);
/// assert!((m.lse[0] - (0.5 + 2f32.ln())).abs() < 1e-6);
/// // A side that saw no key (LSE -inf) weighs nothing, whatever its O holds.
/// let m = quattn::merge_states(&[1.0, 2.0], &[0.0], &[f32::NAN, 7.0], &[f32::NEG_INFINITY])?;
/// assert_eq!((m.o, m.lse), (vec![1.0, 2.0], vec![0.0]));
/// # Ok::<(), quattn::Error>(())
/// ```
pub fn merge_states(o_a: &[f32], lse_a: &[f32], o_b: &[f32], lse_b: &[f32]) -> Result<MergedState> {
    let mut o = o_a.to_vec();
    let mut lse = lse_a.to_vec();
    merge_states_into(&mut o, &mut lse, o_b, lse_b)?;
    Ok(MergedState { o, lse })
}

/// Merges two outputs of `problem` computed over disjoint key sets (the same queries against
/// two parts of the keys): O in the problem's layout and strides, the LSE `[batch, q_heads,
/// q_len]` (both outputs need it: plan with `with_lse(true)`). Elements of O outside the
/// problem's rows (gaps of custom strides) are taken from `a`.
pub fn merge_outputs(problem: &AttentionProblem, a: &Output, b: &Output) -> Result<Output> {
    problem.validate()?;
    let need_o = problem.o_len_elems();
    let need_lse = problem.lse_len_elems();
    for out in [a, b] {
        if out.o.len() != need_o {
            return Err(Error::BufferLength { tensor: TensorName::Output, expected: need_o, got: out.o.len() });
        }
        let got = out.lse.as_ref().map_or(0, |l| l.len());
        if got != need_lse {
            return Err(Error::BufferLength { tensor: TensorName::Lse, expected: need_lse, got });
        }
    }
    let (la, lb) = (a.lse.as_deref().unwrap_or(&[]), b.lse.as_deref().unwrap_or(&[]));
    check_lse(la)?;
    check_lse(lb)?;
    let os = problem.o_strides();
    let dv = problem.v_head_dim;
    let mut o = a.o.clone();
    let mut lse = la.to_vec();
    for bi in 0..problem.batch {
        for h in 0..problem.q_heads {
            for i in 0..problem.q_len {
                let r = (bi * problem.q_heads + h) * problem.q_len + i;
                let at = os.offset(bi, h, i);
                merge_row(&mut o[at..at + dv], &mut lse[r], &b.o[at..at + dv], lb[r]);
            }
        }
    }
    Ok(Output { o, lse: Some(lse), kernel: format!("merge({}, {})", a.kernel, b.kernel) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::attention_f64;
    use crate::{inputs, Layout, Strides};

    /// Keys `range` of K or V (`[.., kv_len, ..]` with strides `s`) as a contiguous tensor of
    /// `layout` with `range.len()` keys.
    fn keys(x: &[f32], s: Strides, p: &AttentionProblem, range: std::ops::Range<usize>, layout: Layout) -> Vec<f32> {
        let n = range.len();
        let d = p.head_dim;
        let out_s = Strides::new(layout, p.kv_heads, n, d);
        let mut out = vec![0.0; p.batch * p.kv_heads * n * d];
        for b in 0..p.batch {
            for h in 0..p.kv_heads {
                for (j, jj) in range.clone().enumerate() {
                    out[out_s.offset(b, h, j)..][..d].copy_from_slice(&x[s.offset(b, h, jj)..][..d]);
                }
            }
        }
        out
    }

    fn output(r: crate::reference::ReferenceOutput) -> Output {
        Output { o: r.o.iter().map(|&x| x as f32).collect(), lse: Some(r.lse.iter().map(|&x| x as f32).collect()), kernel: "reference".into() }
    }

    /// Attention over [K_a; K_b] against the merge of attention over K_a and over K_b, from the
    /// f64 reference rounded to f32: they agree to f32 rounding.
    fn check_split(layout: Layout, causal_b: bool, q_len: usize, na: usize, nb: usize) {
        let full = AttentionProblem::new(2, 4, q_len, 16).kv_heads(2).kv_len(na + nb).causal(causal_b).layout(layout).with_lse(true);
        let (q, k, v) = inputs::qkv(&full, 7);
        let pa = full.clone().kv_len(na).causal(false);
        let pb = full.clone().kv_len(nb).causal(causal_b);
        let (ks, vs) = (full.k_strides(), full.v_strides());
        let part = |p: &AttentionProblem, r: std::ops::Range<usize>| {
            output(attention_f64(p, &q, &keys(&k, ks, &full, r.clone(), layout), &keys(&v, vs, &full, r, layout)).unwrap())
        };
        let (a, b) = (part(&pa, 0..na), part(&pb, na..na + nb));
        let m = merge_outputs(&full, &a, &b).unwrap();
        let r = attention_f64(&full, &q, &k, &v).unwrap();
        let os = full.o_strides();
        let lb = b.lse.as_ref().unwrap();
        let mut compared = 0;
        for bi in 0..full.batch {
            for h in 0..full.q_heads {
                for i in 0..full.q_len {
                    let row = (bi * full.q_heads + h) * full.q_len + i;
                    let at = os.offset(bi, h, i);
                    let got = &m.o[at..at + 16];
                    let lse = m.lse.as_ref().unwrap()[row];
                    assert!(lse.is_finite() && got.iter().all(|x| x.is_finite()), "row {row}: NaN or inf");
                    if lb[row] == f32::NEG_INFINITY {
                        // No key of B visible: the merge is A's state exactly (the full causal
                        // problem is not the reference here: it sees fewer of A's keys).
                        assert_eq!(got, &a.o[at..at + 16], "row {row}");
                        assert_eq!(lse, a.lse.as_ref().unwrap()[row], "row {row}");
                        continue;
                    }
                    compared += 1;
                    for (x, &y) in got.iter().zip(&r.o[at..at + 16]) {
                        assert!((*x as f64 - y).abs() <= 1e-6 * (1.0 + y.abs()), "row {row}: {x} vs {y}");
                    }
                    assert!((lse as f64 - r.lse[row]).abs() <= 1e-5, "row {row}: lse {lse} vs {}", r.lse[row]);
                }
            }
        }
        assert!(compared > 0);
    }

    #[test]
    fn merge_of_two_halves_is_attention_over_both() {
        for layout in [Layout::Bhsd, Layout::Bshd] {
            check_split(layout, false, 3, 37, 29);
            // B causal with at least q_len keys: every row sees all of A and a prefix of B,
            // which is the full causal problem.
            check_split(layout, true, 5, 20, 11);
        }
    }

    #[test]
    fn rows_without_keys_in_one_half_keep_the_other_and_never_nan() {
        // B causal with 3 keys for 8 positions: positions 0..=4 see none of B (LSE -inf).
        check_split(Layout::Bhsd, true, 8, 10, 3);
        check_split(Layout::Bshd, true, 8, 10, 3);
    }

    #[test]
    fn two_empty_states_give_zero_and_minus_infinity() {
        let ninf = f32::NEG_INFINITY;
        let m = merge_states(&[f32::NAN, 3.0], &[ninf], &[f32::NAN, f32::INFINITY], &[ninf]).unwrap();
        assert_eq!(m.o, vec![0.0, 0.0]);
        assert_eq!(m.lse, vec![ninf]);
        // Very different LSEs: the smaller state's weight underflows to 0 without NaN.
        let m = merge_states(&[1.0], &[200.0], &[5.0], &[-200.0]).unwrap();
        assert_eq!((m.o[0], m.lse[0]), (1.0, 200.0));
    }

    #[test]
    fn merge_is_symmetric_and_merging_three_in_any_grouping_agrees() {
        let d = 8;
        let n = 5;
        let o = |s| inputs::normal_with_outliers(n * d, s);
        let l = |s: u64| -> Vec<f32> { inputs::normal_with_outliers(n, s).iter().map(|x| x * 4.0).collect() };
        let (oa, ob, oc) = (o(1), o(2), o(3));
        let (la, lb, mut lc) = (l(4), l(5), l(6));
        lc[2] = f32::NEG_INFINITY;
        let ab = merge_states(&oa, &la, &ob, &lb).unwrap();
        assert_eq!(ab, merge_states(&ob, &lb, &oa, &la).unwrap());
        let ab_c = merge_states(&ab.o, &ab.lse, &oc, &lc).unwrap();
        let bc = merge_states(&ob, &lb, &oc, &lc).unwrap();
        let a_bc = merge_states(&oa, &la, &bc.o, &bc.lse).unwrap();
        for (x, y) in ab_c.o.iter().zip(&a_bc.o) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
        for (x, y) in ab_c.lse.iter().zip(&a_bc.lse) {
            assert!((x - y).abs() <= 1e-5, "{x} vs {y}");
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let e = merge_states(&[1.0, 2.0, 3.0], &[0.0, 0.0], &[1.0, 2.0, 3.0], &[0.0, 0.0]).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { tensor: TensorName::Output, .. }), "{e}");
        let e = merge_states(&[1.0, 2.0], &[0.0], &[1.0], &[0.0]).unwrap_err();
        assert!(matches!(e, Error::BufferLength { tensor: TensorName::Output, expected: 2, got: 1 }), "{e}");
        let e = merge_states(&[1.0, 2.0], &[0.0], &[1.0, 2.0], &[0.0, 1.0]).unwrap_err();
        assert!(matches!(e, Error::BufferLength { tensor: TensorName::Lse, .. }), "{e}");
        let e = merge_states(&[1.0], &[f32::NAN], &[1.0], &[0.0]).unwrap_err();
        assert!(matches!(e, Error::InvalidLse { index: 0, .. }), "{e}");
        let e = merge_states(&[1.0, 1.0], &[0.0, 0.0], &[1.0, 1.0], &[0.0, f32::INFINITY]).unwrap_err();
        assert!(matches!(e, Error::InvalidLse { index: 1, .. }), "{e}");
        assert_eq!(merge_states(&[], &[], &[], &[]).unwrap(), MergedState { o: vec![], lse: vec![] });
        let p = AttentionProblem::new(1, 2, 3, 4).with_lse(true);
        let ok = Output { o: vec![0.0; p.o_len_elems()], lse: Some(vec![0.0; p.lse_len_elems()]), kernel: String::new() };
        let no_lse = Output { lse: None, ..ok.clone() };
        let e = merge_outputs(&p, &ok, &no_lse).unwrap_err();
        assert!(matches!(e, Error::BufferLength { tensor: TensorName::Lse, got: 0, .. }), "{e}");
        let short = Output { o: vec![0.0; 3], ..ok.clone() };
        assert!(matches!(merge_outputs(&p, &short, &ok), Err(Error::BufferLength { tensor: TensorName::Output, .. })));
    }
}
