//! The numerics of the sm_100a INT8 UMMA kernel (`native/cuda/fwd_int8_umma.cu`), mirrored on
//! the CPU: the facade's emulation of `Precision::Int8Qk` run with exactly the kernel's blocking
//! (`Int8UmmaConfig::blocking()`: 128 query rows, 128-key tiles, 4 warps of 32 rows), on inputs
//! with outliers, against the independent f64 reference and the project's INT8 tolerance.
//!
//! The kernel has been compiled and disassembled, never run (there is no sm_100 device): this
//! test shows that the arithmetic it implements (scale layout, tile size, order of operations)
//! is accurate enough, not that the device code computes it. Where the kernel rounds
//! differently from the emulation, the difference is stated here and in the kernel header:
//! * exp2 / log2 are `ex2.approx` / `lg2.approx` (a few ulp) where the emulation uses the CPU's;
//! * inside one 16-key P·V k-step the tensor core sums products in its own order (at least f32
//!   precision), the emulation in key order;
//! * O is written as f16 (the emulation returns f32): modelled below by rounding the emulated
//!   O to f16 before the comparison;
//! * tiles past a row's last visible key are skipped by the emulation and run with p = 0 by
//!   the kernel (alpha = 1, P·V adds exact zeros: no change).
//! Everything else (s = (float)dot · (q_scale · k_scale) with two f32 roundings,
//! p = exp2(s − m_new) unrounded in l, l = l·alpha + Σp in key order, O·alpha before P·V,
//! O = acc / l by division, LSE = m·ln2 + ln l + lse_shift) is the emulation's order, kept
//! exact in the kernel with `.rn` arithmetic that cannot be contracted into FMAs.

use quattn::codec::float16::round_f16_vec;
use quattn::codec::int8::{Int8Blocking, Int8ScaleLayout};
use quattn::emulation::{emulate, Blocking};
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::reference::attention_f64;
use quattn::{AttentionProblem, Int8Granularity, Layout, Precision, PvFormat};
use quattn_native::int8_umma::{BLOCK_Q, WARPS};
use quattn_native::{Int8UmmaConfig, PvAccum};

/// The emulation's blocking for a kernel config (qk_chunk is unused by INT8).
fn kernel_blocking(cfg: &Int8UmmaConfig) -> Blocking {
    let Int8Blocking { block_q, block_k, warps } = cfg.blocking().expect("table head dim");
    Blocking { block_q, block_k, warps, ..Blocking::default() }
}

/// Shapes the kernel handles: both head dims, GQA, causal and not, ragged lengths with a
/// partial last query block and a partial last KV tile, several KV tiles per row, q_len > kv_len
/// under the causal mask (leading rows see no key: O = 0, LSE = -inf), and the BSHD layout.
fn problems(hd: usize) -> Vec<AttentionProblem> {
    vec![
        AttentionProblem::new(1, 4, 200, hd).kv_heads(2).kv_len(333),
        AttentionProblem::new(1, 4, 200, hd).kv_heads(2).kv_len(333).causal(true),
        AttentionProblem::new(2, 2, 130, hd).kv_heads(1).kv_len(70).causal(true).layout(Layout::Bshd),
        AttentionProblem::new(1, 3, 257, hd).kv_len(257).causal(true),
    ]
}

fn check(p: &AttentionProblem, precision: Precision, blocking: &Blocking, seed: u64, what: &str) {
    let (q, k, v) = quattn::inputs::qkv(p, seed);
    let out = emulate(p, precision, blocking, &q, &k, &v).expect("emulation runs");
    let reference = attention_f64(p, &q, &k, &v).expect("reference runs");
    let tol = Tolerance::for_precision(precision);
    let ref_max = reference.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    // The kernel writes f16 O.
    let o16 = round_f16_vec(&out.o);
    for (name, o) in [("f32 O", &out.o), ("f16 O", &o16)] {
        let m = ErrorMetrics::compare(o, &reference.o);
        assert!(tol.accepts(&m, ref_max), "{what}: {name} {m:?} outside {tol:?}");
        // The INT8 error is real (quantization happened), not a disguised f32 path.
        assert!(m.rel_l2 > 1e-5, "{what}: {name} suspiciously exact {m:?}");
    }
    // LSE: the same -inf rows, and |ΔLSE| / (1 + |LSE|) within the bound the emulation's own
    // tests hold INT8 to (src/emulation/tests.rs: 0.06).
    compare_lse(&out.lse, &reference.lse).unwrap_or_else(|| panic!("{what}: -inf rows differ"));
    let lse_err = out
        .lse
        .iter()
        .zip(&reference.lse)
        .filter(|(_, r)| r.is_finite())
        .map(|(x, r)| (*x as f64 - r).abs() / (1.0 + r.abs()))
        .fold(0.0f64, f64::max);
    assert!(lse_err <= 0.06, "{what}: LSE error {lse_err}");
    if p.causal && p.q_len > p.kv_len {
        let empty = p.batch * p.q_heads * (p.q_len - p.kv_len);
        assert_eq!(out.lse.iter().filter(|x| **x == f32::NEG_INFINITY).count(), empty, "{what}");
    }
}

#[test]
fn kernel_blocking_is_accepted_by_the_emulation_for_the_supported_granularities() {
    let p = AttentionProblem::new(1, 2, 300, 128).kv_len(300);
    for hd in [64, 128] {
        for g in [Int8Granularity::PerBlock, Int8Granularity::PerWarp] {
            let cfg = Int8UmmaConfig::new(hd, g, PvAccum::F32).unwrap();
            let blk = kernel_blocking(&cfg);
            assert_eq!((blk.block_q, blk.warps), (BLOCK_Q as usize, WARPS as usize));
            let precision = Precision::Int8Qk { granularity: g, smooth_k: true, pv: PvFormat::F16 };
            blk.validate(&p, precision).unwrap();
        }
        // Per-thread scales: the kernel refuses them, and so does the facade's layout for this
        // blocking (32 rows per warp is not a 16-row MMA fragment): the two agree.
        assert!(Int8UmmaConfig::new(hd, Int8Granularity::PerThread, PvAccum::F32).is_err());
        let cfg = Int8UmmaConfig::new(hd, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
        assert!(cfg.blocking().unwrap().check(Int8Granularity::PerThread).is_err());
    }
}

/// The kernel's scale indexing, transcribed from `fwd_int8_umma.cu` (CTA `m_block` = row / 128,
/// warp = (row % 128) / 32, tile = key / BLOCK_K), equals the facade's `Int8ScaleLayout`.
#[test]
fn kernel_scale_indexing_matches_the_facade_layout() {
    for hd in [64, 128] {
        for g in [Int8Granularity::PerBlock, Int8Granularity::PerWarp] {
            let cfg = Int8UmmaConfig::new(hd, g, PvAccum::F32).unwrap();
            let b = cfg.blocking().unwrap();
            let (block_q, block_k, warps) = (b.block_q, b.block_k, b.warps);
            let p = AttentionProblem::new(2, 6, 300, hd).kv_heads(3).kv_len(517);
            let lay = Int8ScaleLayout::new(&p, g, b).unwrap();
            let (q_blocks, k_blocks) = (p.q_len.div_ceil(block_q), p.kv_len.div_ceil(block_k));
            assert_eq!((lay.q_blocks(), lay.k_blocks()), (q_blocks, k_blocks));
            let group = p.q_heads / p.kv_heads;
            for b in 0..p.batch {
                for h in 0..p.q_heads {
                    for row in 0..p.q_len {
                        let q_block_index = (b * p.q_heads + h) * q_blocks + row / block_q;
                        let kernel = match g {
                            Int8Granularity::PerWarp => q_block_index * warps + (row % block_q) / 32,
                            _ => q_block_index,
                        };
                        assert_eq!(kernel, lay.q_scale_index(b, h, row), "{g:?} ({b},{h},{row})");
                    }
                    for key in 0..p.kv_len {
                        let kernel = (b * (p.q_heads / group) + h / group) * k_blocks + key / block_k;
                        assert_eq!(kernel, lay.k_scale_index(b, h / group, key));
                    }
                }
            }
            assert_eq!(lay.q_scales_len(), p.batch * p.q_heads * q_blocks * if g == Int8Granularity::PerWarp { 4 } else { 1 });
        }
    }
}

#[test]
fn emulation_with_the_kernel_blocking_is_within_the_int8_tolerance() {
    let mut seed = 9000;
    for hd in [64, 128] {
        for g in [Int8Granularity::PerBlock, Int8Granularity::PerWarp] {
            let cfg = Int8UmmaConfig::new(hd, g, PvAccum::F32).unwrap();
            let blk = kernel_blocking(&cfg);
            for (n, p) in problems(hd).iter().enumerate() {
                for smooth_k in [true, false] {
                    let precision = Precision::Int8Qk { granularity: g, smooth_k, pv: PvFormat::F16 };
                    seed += 1;
                    check(p, precision, &blk, seed, &format!("{} shape {n} smooth_k {smooth_k}", cfg.name()));
                }
            }
        }
    }
}

/// The kernel's tile is not the emulation's default: make sure the difference matters (the
/// K-scale blocks differ), i.e. the test above really runs the kernel's blocking.
#[test]
fn kernel_blocking_changes_the_result() {
    let cfg = Int8UmmaConfig::new(64, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
    let blk = kernel_blocking(&cfg);
    assert_ne!(blk.block_k, Blocking::default().block_k);
    let p = AttentionProblem::new(1, 2, 150, 64).kv_len(300);
    let (q, k, v) = quattn::inputs::qkv(&p, 77);
    let precision = Precision::Int8Qk { granularity: Int8Granularity::PerBlock, smooth_k: false, pv: PvFormat::F16 };
    let a = emulate(&p, precision, &blk, &q, &k, &v).unwrap();
    let b = emulate(&p, precision, &Blocking::default(), &q, &k, &v).unwrap();
    assert_ne!(a.o, b.o);
}
