//! The independent f64 reference: naive two-pass softmax, no tiling and no online rescaling, so
//! it shares no structure (and no bug) with any kernel.

use rayon::prelude::*;

use crate::error::Result;
use crate::problem::{AttentionProblem, CausalAlign};

/// Reference output: `o` in the problem's layout, `lse` as `[batch, q_heads, q_len]` (natural log
/// of the softmax denominator of the scaled logits; `-inf` for rows that see no key).
#[derive(Debug, Clone)]
pub struct ReferenceOutput {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Attention in f64 on f32 inputs laid out as `problem.layout` says.
///
/// For each query row: `s_j = scale · q·k_j`, then softcap `s_j = cap · tanh(s_j / cap)`, then
/// ALiBi `s_j -= slope_h · |a(i) − j|`, for the keys the mask lets the row see
/// ([`AttentionProblem::sees`], tested key by key); `m = max(max s_j, sink_h)`,
/// `l = Σ exp(s_j − m) + exp(sink_h − m)` (no sink term without sinks),
/// `o = Σ exp(s_j − m) v_j / l`, `lse = m + ln l`. A row that sees no key has o = 0 and
/// lse = `-inf`, sinks or not.
///
/// A variable-length batch ([`crate::varlen`]) runs the same loop over each sequence's own
/// rows of the packed tensors, with its own lengths.
///
/// With a paged cache ([`crate::paged`]), `k` and `v` are the pools: each sequence's keys are
/// first gathered through the block table into a contiguous `[batch, kv_heads, kv_len, dim]`
/// copy, then the same naive loop runs with each sequence's own length as its `kv_len`.
pub fn attention_f64(problem: &AttentionProblem, q: &[f32], k: &[f32], v: &[f32]) -> Result<ReferenceOutput> {
    problem.validate()?;
    problem.check_lengths(q.len(), k.len(), v.len())?;
    let p = problem;
    let scale = p.softmax_scale() as f64;
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let gathered;
    let (k, v, ks, vs) = match &p.paged {
        Some(pg) => {
            gathered = gather_pages(p, pg, k, v);
            let s = |dim| crate::Strides::new(crate::Layout::Bhsd, p.kv_heads, p.kv_len, dim);
            (&gathered.0[..], &gathered.1[..], s(d), s(dv))
        }
        None => (k, v, p.k_strides(), p.v_strides()),
    };
    let (qs, os) = (p.q_strides(), p.o_strides());
    // One task per query row (rows are independent; parallelism changes no arithmetic).
    // A variable-length batch's rows past a shorter sequence's end do not exist: skipped.
    let rows: Vec<(usize, usize, usize, Vec<f64>, f64)> = (0..p.batch * p.q_heads * p.q_len)
        .into_par_iter()
        .map(|r| (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len))
        .filter(|&(b, _, i)| p.has_q_row(b, i))
        .map(|(b, h, i)| {
            let kh = p.kv_head_of(h);
            // The sequence's own lengths (a paged cache's seq_lens[b], a variable-length
            // batch's cu_seqlens) for the mask and ALiBi.
            let sp = p.sequence(b);
            let keys: Vec<usize> = (0..sp.kv_len).filter(|&j| sp.sees(i, j)).collect();
            let mut orow = vec![0.0f64; dv];
            if keys.is_empty() {
                return (b, h, i, orow, f64::NEG_INFINITY); // O stays 0, LSE is -inf.
            }
            let (qb, qi) = p.q_position(b, i);
            let qrow = &q[qs.offset(qb, h, qi)..][..d];
            let s: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    let (kb, kj) = p.k_position(b, j);
                    let krow = &k[ks.offset(kb, kh, kj)..][..d];
                    let mut x = qrow.iter().zip(krow).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale;
                    if let Some(cap) = p.softcap {
                        let cap = cap as f64;
                        x = cap * (x / cap).tanh();
                    }
                    if let Some(slopes) = &p.alibi_slopes {
                        // |a(i) - j| with a(i) = i + kv_len - q_len (bottom-right) or i.
                        let a = match p.causal_align {
                            CausalAlign::BottomRight => i as f64 + sp.kv_len as f64 - sp.q_len as f64,
                            CausalAlign::TopLeft => i as f64,
                        };
                        x -= slopes[h] as f64 * (a - j as f64).abs();
                    }
                    x
                })
                .collect();
            let sink = p.sinks.as_ref().map(|s| s[h] as f64);
            let m = s.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
            for (&j, &pj) in keys.iter().zip(&e) {
                let (kb, kj) = p.k_position(b, j);
                let vrow = &v[vs.offset(kb, kh, kj)..][..dv];
                for (oc, &vc) in orow.iter_mut().zip(vrow) {
                    *oc += pj * vc as f64;
                }
            }
            for oc in orow.iter_mut() {
                *oc /= l;
            }
            (b, h, i, orow, m + l.ln())
        })
        .collect();
    let mut o = vec![0.0f64; p.o_len_elems()];
    let mut lse = vec![f64::NEG_INFINITY; p.lse_len_elems()];
    for (b, h, i, orow, l) in rows {
        let (ob, oi) = p.q_position(b, i);
        o[os.offset(ob, h, oi)..][..dv].copy_from_slice(&orow);
        lse[p.lse_index(b, h, i)] = l;
    }
    Ok(ReferenceOutput { o, lse })
}

/// Each sequence's keys and values copied out of the pools, in block-table order, into
/// `[batch, kv_heads, kv_len, dim]` (zeros past the sequence's length).
fn gather_pages(p: &AttentionProblem, pg: &crate::paged::PagedKv, k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (d, dv, hk, n) = (p.head_dim, p.v_head_dim, p.kv_heads, p.kv_len);
    let mut kg = vec![0.0f32; p.batch * hk * n * d];
    let mut vg = vec![0.0f32; p.batch * hk * n * dv];
    for b in 0..p.batch {
        for j in 0..pg.seq_lens[b] as usize {
            let page = pg.block_table[b * pg.max_pages + j / pg.page_size] as usize;
            let row = page * pg.page_size + j % pg.page_size; // row of the pool
            for h in 0..hk {
                kg[((b * hk + h) * n + j) * d..][..d].copy_from_slice(&k[(row * hk + h) * d..][..d]);
                vg[((b * hk + h) * n + j) * dv..][..dv].copy_from_slice(&v[(row * hk + h) * dv..][..dv]);
            }
        }
    }
    (kg, vg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Layout;

    #[test]
    fn single_key_returns_its_value_and_logit() {
        // With one key, softmax is 1: O = v, LSE = scale·q·k.
        let p = AttentionProblem::new(1, 1, 1, 4).kv_len(1).scale(0.5);
        let q = [1.0, 2.0, 3.0, 4.0];
        let k = [0.5, -1.0, 2.0, 0.25];
        let v = [7.0, -3.0, 0.125, 9.0];
        let r = attention_f64(&p, &q, &k, &v).unwrap();
        assert_eq!(r.o, v.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let dot = 0.5 - 2.0 + 6.0 + 1.0;
        assert!((r.lse[0] - 0.5 * dot).abs() < 1e-12);
    }

    #[test]
    fn two_keys_match_closed_form() {
        // Two keys with logits a, b: weights e^a/(e^a+e^b), e^b/(e^a+e^b).
        let p = AttentionProblem::new(1, 1, 1, 1).kv_len(2).scale(1.0);
        let r = attention_f64(&p, &[2.0], &[1.0, -0.5], &[10.0, 20.0]).unwrap();
        let (a, b) = (2.0f64, -1.0f64);
        let w = a.exp() / (a.exp() + b.exp());
        assert!((r.o[0] - (w * 10.0 + (1.0 - w) * 20.0)).abs() < 1e-12);
        assert!((r.lse[0] - (a.exp() + b.exp()).ln()).abs() < 1e-12);
    }

    #[test]
    fn causal_bottom_right_and_empty_rows() {
        // q_len 3 > kv_len 2: row 0 sees nothing, row 1 sees key 0, row 2 sees keys 0 and 1.
        let p = AttentionProblem::new(1, 1, 3, 1).kv_len(2).causal(true).scale(1.0);
        let r = attention_f64(&p, &[1.0, 1.0, 1.0], &[0.0, 0.0], &[3.0, 5.0]).unwrap();
        assert_eq!(r.o[0], 0.0);
        assert_eq!(r.lse[0], f64::NEG_INFINITY);
        assert_eq!(r.o[1], 3.0);
        assert!((r.o[2] - 4.0).abs() < 1e-12);
        assert!((r.lse[2] - 2f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn layouts_and_gqa_agree() {
        // The same logical tensors in BHSD and BSHD give the same result; GQA maps heads 0,1 -> 0.
        let (b, hq, hk, s, d) = (2, 4, 2, 5, 3);
        let bhsd = AttentionProblem::new(b, hq, s, d).kv_heads(hk).causal(true);
        let bshd = bhsd.clone().layout(Layout::Bshd);
        let val = |b: usize, h: usize, s: usize, c: usize, t: usize| ((b * 31 + h * 17 + s * 7 + c * 3 + t) % 11) as f32 - 5.0;
        let fill = |p: &AttentionProblem, heads: usize, strides: crate::Strides, t: usize| {
            let mut x = vec![0.0; p.batch * heads * s * d];
            for bi in 0..p.batch {
                for h in 0..heads {
                    for si in 0..s {
                        for c in 0..d {
                            x[strides.offset(bi, h, si) + c] = val(bi, h, si, c, t);
                        }
                    }
                }
            }
            x
        };
        let run = |p: &AttentionProblem| {
            let q = fill(p, hq, p.q_strides(), 0);
            let k = fill(p, hk, p.k_strides(), 1);
            let v = fill(p, hk, p.v_strides(), 2);
            attention_f64(p, &q, &k, &v).unwrap()
        };
        let (r1, r2) = (run(&bhsd), run(&bshd));
        assert_eq!(r1.lse, r2.lse);
        for bi in 0..b {
            for h in 0..hq {
                for si in 0..s {
                    for c in 0..d {
                        let x = r1.o[bhsd.o_strides().offset(bi, h, si) + c];
                        let y = r2.o[bshd.o_strides().offset(bi, h, si) + c];
                        assert!((x - y).abs() < 1e-12);
                    }
                }
            }
        }
        // Q heads 0 and 1 share KV head 0: with equal Q rows they would match; here check that
        // head 2 uses KV head 1 by recomputing it as a 1-head problem.
        let one = AttentionProblem::new(1, 1, s, d).causal(true);
        let q = fill(&bhsd, hq, bhsd.q_strides(), 0);
        let k = fill(&bhsd, hk, bhsd.k_strides(), 1);
        let v = fill(&bhsd, hk, bhsd.v_strides(), 2);
        let qh = &q[bhsd.q_strides().offset(0, 2, 0)..][..s * d];
        let kh = &k[bhsd.k_strides().offset(0, 1, 0)..][..s * d];
        let vh = &v[bhsd.v_strides().offset(0, 1, 0)..][..s * d];
        let r3 = attention_f64(&one, qh, kh, vh).unwrap();
        assert_eq!(&r1.o[bhsd.o_strides().offset(0, 2, 0)..][..s * d], &r3.o[..]);
    }
}
