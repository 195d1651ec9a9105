//! The vector FMA kernel on packed variable-length batches ([`quattn_cubecl::launch_varlen`])
//! on wgpu (llvmpipe on machines without a GPU), each sequence against a naive f64 loop.
//! Five kernel builds (f32 causal and not, f16 causal with GQA, f16 with `dv != d`, f32 with
//! score modifiers); each runs two batches of ragged sequences (empty, single-row, key-less,
//! longer and shorter than the tiles), one of them with padded rows.
#![cfg(feature = "wgpu")]

mod common;

use common::{download, random_tensor, upload, wgpu_client, Tolerance};
use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::wgpu::WgpuRuntime;
use quattn_core::Strides;
use quattn_cubecl::{
    mma_candidates, Accumulation, AttentionShape, Dtype as ElemType, Family, LaunchError, PortableKernel, ScoreMods, VarlenBatch,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// What the kernel must leave alone: the padding between rows and the region past the last
/// row of O, and the LSE past `q_heads · total_q`. Exact in f16.
const CANARY: f64 = -777.0;
/// Elements of O and of the LSE past the packed extent.
const TAIL: usize = 64;

/// One packed batch: `(q_len, kv_len)` per sequence, `pad` extra elements at the end of every
/// token row of every tensor.
#[derive(Debug, Clone)]
struct Batch {
    elem: ElemType,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    v_head_dim: usize,
    causal: bool,
    seqs: Vec<(usize, usize)>,
    pad: usize,
    seed: u64,
    /// Score modifiers: the run goes through `launch_modified_varlen`.
    mods: Option<Mods>,
}

/// The score modifiers of a batch ([`ScoreMods`] in owned form).
#[derive(Debug, Clone)]
struct Mods {
    top_left: bool,
    left: Option<u32>,
    right: Option<u32>,
    softcap: Option<f32>,
    sinks: Option<Vec<f32>>,
    slopes: Option<Vec<f32>>,
}

impl Mods {
    fn score_mods(&self) -> ScoreMods<'_> {
        ScoreMods {
            top_left: self.top_left,
            window_left: self.left,
            window_right: self.right,
            softcap: self.softcap,
            sinks: self.sinks.as_deref(),
            alibi_slopes: self.slopes.as_deref(),
        }
    }
}

impl Batch {
    fn offsets(lens: impl Iterator<Item = usize>) -> Vec<u32> {
        let mut cu = vec![0u32];
        for len in lens {
            cu.push(cu.last().unwrap() + len as u32);
        }
        cu
    }
    fn cu_q(&self) -> Vec<u32> {
        Self::offsets(self.seqs.iter().map(|s| s.0))
    }
    fn cu_k(&self) -> Vec<u32> {
        Self::offsets(self.seqs.iter().map(|s| s.1))
    }
    fn total_q(&self) -> usize {
        self.seqs.iter().map(|s| s.0).sum()
    }
    fn total_k(&self) -> usize {
        self.seqs.iter().map(|s| s.1).sum()
    }
    /// Row strides of Q, K, V, O.
    fn row_strides(&self) -> [usize; 4] {
        let (hq, hk, d, dv, pad) = (self.q_heads, self.kv_heads, self.head_dim, self.v_head_dim, self.pad);
        [hq * d + pad, hk * d + pad, hk * dv + pad, hq * dv + pad]
    }

    /// The shape `launch_varlen` takes: one "batch" entry per sequence, the longest lengths,
    /// token-major strides (batch strides unused, 0).
    fn shape(&self) -> AttentionShape {
        let [qs, ks, vs, os] = self.row_strides();
        let (d, dv) = (self.head_dim, self.v_head_dim);
        AttentionShape {
            batch: self.seqs.len(),
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            q_len: self.seqs.iter().map(|s| s.0).max().unwrap_or(0),
            kv_len: self.seqs.iter().map(|s| s.1).max().unwrap_or(0),
            head_dim: d,
            v_head_dim: dv,
            causal: self.causal,
            scale: 1.0 / (d as f32).sqrt(),
            q: Strides { batch: 0, head: d, seq: qs },
            k: Strides { batch: 0, head: d, seq: ks },
            v: Strides { batch: 0, head: dv, seq: vs },
            o: Strides { batch: 0, head: dv, seq: os },
            write_lse: true,
        }
    }
}

/// A packed tensor of `rows` token rows: random values (with outliers) in each head's
/// `dim` entries, NaN in the row padding and in one extra row past the end, so that a read
/// outside the rows the kernel owns shows up in its output.
fn packed_input(rng: &mut StdRng, elem: ElemType, rows: usize, heads: usize, dim: usize, row_stride: usize) -> Vec<f64> {
    let values = random_tensor(rng, [1, 1, rows * heads, dim], elem).data;
    let mut out = vec![f64::NAN; ((rows + 1) * row_stride).max(4)];
    for t in 0..rows {
        for h in 0..heads {
            let src = (t * heads + h) * dim;
            out[t * row_stride + h * dim..][..dim].copy_from_slice(&values[src..src + dim]);
        }
    }
    out
}

/// Naive f64 attention of each sequence: `(O [total_q, q_heads, dv], LSE [q_heads, total_q])`.
/// Row `i` of a sequence of `q_len x kv_len` sits at `a = i + kv_len - q_len` (bottom-right)
/// or `a = i` (top-left) and sees key `j` iff `j <= a + right` and `j >= a - left` where
/// bounded (causal: right = 0); softcap, then ALiBi `-slope · |a - j|` on the scaled score;
/// a sink joins the denominator. Rows without keys: O = 0 and LSE = -inf.
fn reference(b: &Batch, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let [qs, ks, vs, _] = b.row_strides();
    let (hq, d, dv) = (b.q_heads, b.head_dim, b.v_head_dim);
    let group = b.q_heads / b.kv_heads;
    let scale = b.shape().scale as f64;
    let (cu_q, cu_k) = (b.cu_q(), b.cu_k());
    let total_q = b.total_q();
    let mut o = vec![0.0; total_q * hq * dv];
    let mut lse = vec![f64::NEG_INFINITY; hq * total_q];
    for (s, &(ql, kl)) in b.seqs.iter().enumerate() {
        let (q0, k0) = (cu_q[s] as usize, cu_k[s] as usize);
        for h in 0..hq {
            let kh = h / group;
            for i in 0..ql {
                let top_left = b.mods.as_ref().is_some_and(|m| m.top_left);
                let a = if top_left { i as i64 } else { i as i64 + kl as i64 - ql as i64 };
                let right = if b.causal { Some(0) } else { b.mods.as_ref().and_then(|m| m.right) };
                let left = b.mods.as_ref().and_then(|m| m.left);
                let keys: Vec<usize> = (0..kl)
                    .filter(|&j| right.is_none_or(|r| j as i64 <= a + r as i64) && left.is_none_or(|l| j as i64 >= a - l as i64))
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let qrow = &q[(q0 + i) * qs + h * d..][..d];
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let krow = &k[(k0 + j) * ks + kh * d..][..d];
                        let mut x = scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>();
                        if let Some(cap) = b.mods.as_ref().and_then(|m| m.softcap) {
                            x = cap as f64 * (x / cap as f64).tanh();
                        }
                        if let Some(slopes) = b.mods.as_ref().and_then(|m| m.slopes.as_ref()) {
                            x -= slopes[h] as f64 * (a - j as i64).abs() as f64;
                        }
                        x
                    })
                    .collect();
                let sink = b.mods.as_ref().and_then(|m| m.sinks.as_ref()).map(|s| s[h] as f64);
                let m = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = scores.iter().map(|x| (x - m).exp()).sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
                let t = q0 + i;
                for c in 0..dv {
                    let acc: f64 =
                        keys.iter().zip(&scores).map(|(&j, &x)| (x - m).exp() * v[(k0 + j) * vs + kh * dv + c]).sum();
                    o[(t * hq + h) * dv + c] = acc / l;
                }
                lse[h * total_q + t] = m + l.ln();
            }
        }
    }
    (o, lse)
}

fn upload_u32(client: &ComputeClient<WgpuRuntime>, values: &[u32]) -> Handle {
    client.create_from_slice(u32::as_bytes(values))
}

/// The FMA kernel the selection gives the batch's shape.
fn select(client: &ComputeClient<WgpuRuntime>, b: &Batch) -> PortableKernel {
    let kernel =
        quattn_cubecl::select(client, &b.shape(), b.elem, Accumulation::default(), Some(Family::Fma)).expect("selection").kernel;
    assert!(matches!(kernel, PortableKernel::Fma(_)), "{kernel:?}");
    kernel
}

/// Runs `kernel` on the batch with O and LSE poisoned (NaN where the kernel writes, the canary
/// elsewhere) and checks every sequence against the reference and every canary.
fn check(client: &ComputeClient<WgpuRuntime>, kernel: &PortableKernel, b: &Batch) {
    let shape = b.shape();
    let mut rng = StdRng::seed_from_u64(b.seed);
    let [qs, ks, vs, os] = b.row_strides();
    let (hq, hk, d, dv) = (b.q_heads, b.kv_heads, b.head_dim, b.v_head_dim);
    let (total_q, total_k) = (b.total_q(), b.total_k());
    let q = packed_input(&mut rng, b.elem, total_q, hq, d, qs);
    let k = packed_input(&mut rng, b.elem, total_k, hk, d, ks);
    let v = packed_input(&mut rng, b.elem, total_k, hk, dv, vs);

    // O: NaN in every element the kernel writes, the canary in the row padding and the tail.
    let mut o_init = vec![CANARY; total_q * os + TAIL];
    for t in 0..total_q {
        for h in 0..hq {
            o_init[t * os + h * dv..][..dv].fill(f64::NAN);
        }
    }
    let mut lse_init = vec![f64::NAN; hq * total_q + TAIL];
    lse_init[hq * total_q..].fill(CANARY);

    let (q_h, k_h, v_h) = (upload(client, b.elem, &q), upload(client, b.elem, &k), upload(client, b.elem, &v));
    let o_h = upload(client, b.elem, &o_init);
    let lse_h = upload(client, ElemType::F32, &lse_init);
    let (cu_q, cu_k) = (upload_u32(client, &b.cu_q()), upload_u32(client, &b.cu_k()));
    let varlen = VarlenBatch { total_q, total_k, cu_seqlens_q: &cu_q, cu_seqlens_k: &cu_k };
    let info = match &b.mods {
        None => quattn_cubecl::launch_varlen(client, kernel, &shape, b.elem, &varlen, &q_h, &k_h, &v_h, &o_h, Some(&lse_h)),
        Some(m) => quattn_cubecl::launch_modified_varlen(
            client,
            kernel,
            &shape,
            b.elem,
            &m.score_mods(),
            &varlen,
            &q_h,
            &k_h,
            &v_h,
            &o_h,
            Some(&lse_h),
        ),
    }
    .expect("launch refused");
    assert!(info.launched, "{info:?}");
    assert!(info.kernel.starts_with("portable_fma_vec_") && info.kernel.ends_with("_varlen"), "{}", info.kernel);

    let o = download(client, b.elem, o_h);
    let lse = download(client, ElemType::F32, lse_h);
    let (o_ref, lse_ref) = reference(b, &q, &k, &v);
    let tol = Tolerance::for_elem(b.elem);

    let same = |x: f64, y: f64| x.to_bits() == y.to_bits();
    let mut written = vec![false; o.len()];
    let cu_q_host = b.cu_q();
    for (s, &(ql, kl)) in b.seqs.iter().enumerate() {
        let (mut err2, mut ref2, mut lse_err) = (0.0f64, 0.0f64, 0.0f64);
        for t in cu_q_host[s] as usize..cu_q_host[s] as usize + ql {
            for h in 0..hq {
                let want_lse = lse_ref[h * total_q + t];
                let got_lse = lse[h * total_q + t];
                let empty = want_lse == f64::NEG_INFINITY;
                let ctx = || format!("sequence {s} ({ql} x {kl}) row {t} head {h} of {b:?}");
                if empty {
                    assert!(got_lse == f64::NEG_INFINITY, "LSE {got_lse}, want -inf: {}", ctx());
                } else {
                    assert!(got_lse.is_finite(), "LSE {got_lse}: {}", ctx());
                    lse_err = lse_err.max((got_lse - want_lse).abs());
                }
                for c in 0..dv {
                    let idx = t * os + h * dv + c;
                    written[idx] = true;
                    let (got, want) = (o[idx], o_ref[(t * hq + h) * dv + c]);
                    assert!(got.is_finite(), "O[{c}] = {got}: {}", ctx());
                    if empty {
                        assert!(got == 0.0, "O[{c}] = {got} on a row without keys: {}", ctx());
                    }
                    err2 += (got - want).powi(2);
                    ref2 += want * want;
                }
            }
        }
        let rel = if ref2 > 0.0 { (err2 / ref2).sqrt() } else { err2.sqrt() };
        println!("{} sequence {s} ({ql} x {kl}): O rel-L2 {rel:.2e}, LSE max abs {lse_err:.2e}", info.kernel);
        assert!(rel < tol.o_rel_l2, "sequence {s} ({ql} x {kl}): O rel-L2 {rel:e} of {b:?}");
        assert!(lse_err < tol.lse_abs, "sequence {s} ({ql} x {kl}): LSE error {lse_err:e} of {b:?}");
    }
    let touched: Vec<usize> = (0..o.len()).filter(|&i| !written[i] && !same(o[i], CANARY)).collect();
    assert!(touched.is_empty(), "{} O elements outside the rows written (first at {}) of {b:?}", touched.len(), touched[0]);
    let lse_touched = lse[hq * total_q..].iter().filter(|&&x| !same(x, CANARY)).count();
    assert_eq!(lse_touched, 0, "LSE past q_heads · total_q written of {b:?}");
}

/// Ragged sequences: without queries, without keys, a single row and key, lengths off the
/// tile multiples and over several query and key tiles (the tiles are at most 64 rows), more
/// queries than keys (causal rows that see nothing) and fewer; the longest sizes the grid, so
/// the shorter sequences' cubes past their queries leave at once.
fn ragged_first() -> Vec<(usize, usize)> {
    vec![(17, 33), (0, 5), (1, 1), (130, 97), (40, 7), (5, 0), (33, 33), (1, 40), (0, 0), (23, 70)]
}
fn ragged_second() -> Vec<(usize, usize)> {
    vec![(64, 64), (3, 70), (65, 200), (29, 2), (0, 17), (50, 51)]
}

fn run_both(b: Batch) {
    let Some(client) = wgpu_client() else { return };
    let kernel = select(&client, &b);
    println!("{kernel:?}");
    check(&client, &kernel, &Batch { seqs: ragged_first(), pad: 0, ..b.clone() });
    check(&client, &kernel, &Batch { seqs: ragged_second(), pad: 8, seed: b.seed ^ 0x9e37, ..b });
}

fn batch(elem: ElemType, head_dim: usize, causal: bool) -> Batch {
    Batch {
        elem,
        q_heads: 4,
        kv_heads: 2,
        head_dim,
        v_head_dim: head_dim,
        causal,
        seqs: Vec::new(),
        pad: 0,
        seed: 0x7a51 ^ head_dim as u64 ^ (causal as u64) << 12,
        mods: None,
    }
}

#[test]
fn varlen_f32_causal_gqa() {
    run_both(batch(ElemType::F32, 32, true));
}

#[test]
fn varlen_f32_noncausal_gqa() {
    run_both(batch(ElemType::F32, 32, false));
}

#[test]
fn varlen_f16_causal_gqa_4_to_1() {
    run_both(Batch { q_heads: 8, kv_heads: 2, ..batch(ElemType::F16, 64, true) });
}

#[test]
fn varlen_f16_noncausal_mqa_wider_v() {
    run_both(Batch { q_heads: 2, kv_heads: 1, v_head_dim: 64, ..batch(ElemType::F16, 32, false) });
}

/// The modifier kernel on packed sequences: a two-sided sliding window, softcap, ALiBi and
/// sinks, each sequence aligned bottom-right with its own lengths (the window of a sequence
/// with fewer queries than keys starts further right).
#[test]
fn varlen_f32_modifiers_window_softcap_alibi_sinks() {
    let b = batch(ElemType::F32, 32, false);
    let mods = Mods {
        top_left: false,
        left: Some(21),
        right: Some(6),
        softcap: Some(2.5),
        sinks: Some(vec![0.7, -1.3, 2.1, -30.0]),
        slopes: Some(vec![0.5, 0.125, 0.03125, 0.0078125]),
    };
    run_both(Batch { mods: Some(mods), seed: b.seed ^ 0x3c3c, ..b });
}

/// Refusals before anything is compiled or enqueued: another kernel than the FMA one, offset
/// buffers without `batch + 1` entries, tensors or an LSE smaller than the packed extents.
#[test]
fn varlen_refusals() {
    let Some(client) = wgpu_client() else { return };
    let b = Batch { seqs: ragged_first(), ..batch(ElemType::F32, 32, true) };
    let shape = b.shape();
    let kernel = select(&client, &b);
    let (total_q, total_k) = (b.total_q(), b.total_k());
    let [qs, ks, vs, os] = b.row_strides();
    let zeros = |n: usize| upload(&client, ElemType::F32, &vec![0.0; n]);
    let (q, k, v, o) = (zeros(total_q * qs), zeros(total_k * ks), zeros(total_k * vs), zeros(total_q * os));
    let lse = zeros(b.q_heads * total_q);
    let (cu_q, cu_k) = (upload_u32(&client, &b.cu_q()), upload_u32(&client, &b.cu_k()));
    let good = VarlenBatch { total_q, total_k, cu_seqlens_q: &cu_q, cu_seqlens_k: &cu_k };
    let launch = |kernel: &PortableKernel, varlen: &VarlenBatch<'_>, o: &Handle, lse: &Handle| {
        quattn_cubecl::launch_varlen(&client, kernel, &shape, b.elem, varlen, &q, &k, &v, o, Some(lse))
    };

    let mma = PortableKernel::Mma(mma_candidates(32)[0]);
    assert!(matches!(launch(&mma, &good, &o, &lse), Err(LaunchError::WrongKernel { .. })));

    let short = upload_u32(&client, &b.cu_q()[..b.seqs.len()]);
    let err = launch(&kernel, &VarlenBatch { cu_seqlens_q: &short, ..good }, &o, &lse).unwrap_err();
    assert!(matches!(err, LaunchError::BufferTooSmall { tensor: "cu_seqlens_q", .. }), "{err:?}");
    let err = launch(&kernel, &VarlenBatch { cu_seqlens_k: &short, ..good }, &o, &lse).unwrap_err();
    assert!(matches!(err, LaunchError::BufferTooSmall { tensor: "cu_seqlens_k", .. }), "{err:?}");

    let small_o = zeros(total_q * os - 4);
    let err = launch(&kernel, &good, &small_o, &lse).unwrap_err();
    assert!(matches!(err, LaunchError::BufferTooSmall { tensor: "o", .. }), "{err:?}");
    let err = launch(&kernel, &VarlenBatch { total_k: total_k + 1, ..good }, &o, &lse).unwrap_err();
    assert!(matches!(err, LaunchError::BufferTooSmall { tensor: "k", .. }), "{err:?}");
    let small_lse = zeros(b.q_heads * total_q - 1);
    let err = launch(&kernel, &good, &o, &small_lse).unwrap_err();
    assert!(matches!(err, LaunchError::BufferTooSmall { tensor: "lse", .. }), "{err:?}");
}
