//! The portable FMA kernel on wgpu (llvmpipe on machines without a GPU), against the naive
//! f64 reference in `common`. Shapes are small: llvmpipe on two cores is slow.
#![cfg(feature = "wgpu")]

mod common;

use common::{run_case, wgpu_client, Case, Layout};
use quattn_cubecl::{
    fma_candidates, fma_vec_candidates, Accumulation, ElemType, KvLoads, LaunchOptions, QkAccumulation, Variant,
};

fn check(case: Case) {
    check_with(case, &LaunchOptions::default());
}

fn check_with(case: Case, options: &LaunchOptions) {
    let Some(client) = wgpu_client() else { return };
    let report = run_case(&client, &case, options).expect("launch refused");
    println!("{case:?}\n  -> {report:?}");
    report.assert_within(&case);
}

// f32: ragged lengths, causal and not, every head dim.

#[test]
fn f32_d64_noncausal_ragged() {
    check(Case::new(17, 33, 64, false, ElemType::F32));
    check(Case::new(1, 127, 64, false, ElemType::F32));
}

#[test]
fn f32_d64_causal_square_300() {
    check(Case { q_heads: 1, ..Case::new(300, 300, 64, true, ElemType::F32) });
}

#[test]
fn f32_d32_causal_q_longer_than_kv() {
    // Bottom-right alignment: the first 110 rows see no key at all (O = 0, LSE = -inf).
    check(Case::new(127, 17, 32, true, ElemType::F32));
}

#[test]
fn f32_d128_causal_single_query() {
    check(Case::new(1, 300, 128, true, ElemType::F32));
}

#[test]
fn f32_d96_causal_kv_longer() {
    check(Case::new(17, 127, 96, true, ElemType::F32));
}

#[test]
fn f32_d256_noncausal() {
    check(Case { q_heads: 1, ..Case::new(17, 40, 256, false, ElemType::F32) });
}

#[test]
fn f32_different_v_head_dim() {
    check(Case { v_head_dim: 128, ..Case::new(17, 45, 64, true, ElemType::F32) });
}

#[test]
fn f32_gqa_bshd() {
    // 8 query heads over 2 KV heads, BSHD strides, batch 2.
    check(Case {
        batch: 2,
        q_heads: 8,
        kv_heads: 2,
        layout: Layout::Bshd,
        ..Case::new(17, 33, 32, true, ElemType::F32)
    });
}

#[test]
fn f32_kv_len_zero() {
    // Every row sees nothing.
    check(Case::new(5, 0, 32, false, ElemType::F32));
}

// f16 inputs and outputs, f32 accumulation.

#[test]
fn f16_d128_gqa_bshd_causal() {
    check(Case {
        q_heads: 8,
        kv_heads: 2,
        layout: Layout::Bshd,
        ..Case::new(127, 127, 128, true, ElemType::F16)
    });
}

#[test]
fn f16_d64_noncausal_bhsd() {
    check(Case::new(300, 17, 64, false, ElemType::F16));
}

#[test]
fn f16_d256_causal() {
    check(Case { q_heads: 1, ..Case::new(17, 64, 256, true, ElemType::F16) });
}

#[test]
fn f16_d32_causal_q_longer_than_kv() {
    check(Case::new(300, 127, 32, true, ElemType::F16));
}

// Kernel knobs: both rescale policies and every tiling of the table that fits the runtime.

#[test]
fn eager_rescale_is_exact_too() {
    let options = LaunchOptions { lazy_rescale: false, ..LaunchOptions::default() };
    check_with(Case::new(127, 300, 64, true, ElemType::F32), &options);
    check_with(Case::new(17, 127, 128, false, ElemType::F16), &options);
}

/// Every K/V staging moves the same values into shared memory, so every choice gives the same
/// bits: per-row guarded loads, one bounds decision per tile, loads prefetched into registers,
/// and (packed-f16 kernel) separate K and V stages with two barriers per tile. Ragged causal
/// shapes, so both the full-tile and the partial-tile loads run; f32 and f16 accumulation.
#[test]
fn kv_staging_is_bit_identical() {
    let Some(client) = wgpu_client() else { return };
    let half = Accumulation { qk: QkAccumulation::TwoStage { chunk: 32 }, pv_f16: true };
    for (case, accumulation) in [
        (Case::new(127, 300, 64, true, ElemType::F16), Accumulation::default()),
        (Case::new(77, 150, 64, false, ElemType::F32), Accumulation::default()),
        (Case::new(127, 300, 64, true, ElemType::F16), half),
        (Case::new(45, 97, 64, false, ElemType::F16), half),
    ] {
        let mut stagings = vec![
            (KvLoads::Direct, Some(false)),
            (KvLoads::TileChecked, Some(false)),
            (KvLoads::Prefetch, Some(false)),
        ];
        if accumulation != Accumulation::default() {
            stagings.push((KvLoads::Direct, Some(true)));
            stagings.push((KvLoads::Prefetch, Some(true)));
        }
        let mut first: Option<common::Report> = None;
        for (kv_loads, split_kv) in stagings {
            let options = LaunchOptions {
                variant: Variant::PortableFma,
                accumulation,
                kv_loads: Some(kv_loads),
                split_kv,
                ..LaunchOptions::default()
            };
            let report = run_case(&client, &case, &options).expect("launch refused");
            println!("{case:?} {kv_loads:?} split {split_kv:?}\n  -> {}: rel-L2 {:.2e}", report.info.kernel, report.o_rel_l2);
            assert_eq!(report.o_non_finite, 0, "{}: unwritten O", report.info.kernel);
            match &first {
                None => {
                    // The f16-accumulating mode's own bound is checked (against its emulation)
                    // in the facade's tests; here the reference run must at least be close.
                    let bound = if accumulation == Accumulation::default() { None } else { Some(1e-2) };
                    match bound {
                        None => report.assert_within(&case),
                        Some(b) => assert!(report.o_rel_l2 < b, "{}: rel-L2 {}", report.info.kernel, report.o_rel_l2),
                    }
                    first = Some(report);
                }
                Some(f) => {
                    let same = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                    assert!(same(&f.o, &report.o), "{} O differs from {}", report.info.kernel, f.info.kernel);
                    assert!(same(&f.lse, &report.lse), "{} LSE differs from {}", report.info.kernel, f.info.kernel);
                }
            }
        }
    }
}

#[test]
fn every_fitting_tile_config() {
    let Some(client) = wgpu_client() else { return };
    let smem = client.properties().hardware.max_shared_memory_size;
    for (d, elem) in [(64, ElemType::F32), (128, ElemType::F16)] {
        for &tiles in fma_candidates(d) {
            if tiles.smem_bytes(d, d, elem.size_bytes() as u32) as usize > smem {
                continue;
            }
            let options = LaunchOptions {
                variant: Variant::PortableFmaScalar,
                fma_tiles: Some(tiles),
                ..LaunchOptions::default()
            };
            let case = Case::new(37, 75, d, true, elem);
            let report = run_case(&client, &case, &options).expect("launch refused");
            println!("{tiles}: {report:?}");
            report.assert_within(&case);
        }
    }
}

#[test]
fn every_fitting_vec_tile_config() {
    let Some(client) = wgpu_client() else { return };
    let smem = client.properties().hardware.max_shared_memory_size;
    for (d, elem) in [(64, ElemType::F32), (64, ElemType::F16), (128, ElemType::F16), (256, ElemType::F16)] {
        for &tiles in fma_vec_candidates(d) {
            if tiles.smem_bytes(d, d, elem.size_bytes() as u32) as usize > smem {
                continue;
            }
            for lazy_rescale in [true, false] {
                let options = LaunchOptions {
                    variant: Variant::PortableFma,
                    fma_vec_tiles: Some(tiles),
                    lazy_rescale,
                    ..LaunchOptions::default()
                };
                let case = Case { q_heads: 1, ..Case::new(37, 75, d, true, elem) };
                let report = run_case(&client, &case, &options).expect("launch refused");
                println!("{tiles} lazy={lazy_rescale}: {report:?}");
                assert!(report.info.kernel.contains("fma_vec"), "{}", report.info.kernel);
                report.assert_within(&case);
            }
        }
    }
}

#[test]
fn scalar_kernel_still_runs() {
    let options = LaunchOptions { variant: Variant::PortableFmaScalar, ..LaunchOptions::default() };
    check_with(Case::new(17, 127, 128, true, ElemType::F16), &options);
    check_with(Case::new(33, 40, 64, false, ElemType::F32), &options);
}
