//! The portable FMA kernels on wgpu (llvmpipe on machines without a GPU), against the naive
//! f64 reference in `common`. Shapes are small: llvmpipe on two cores is slow.
#![cfg(feature = "wgpu")]

mod common;

use common::{run_case, run_selected, select, wgpu_client, Case, Layout};
use quattn_cubecl::{
    fma_vec_candidates, Accumulation, Dtype as ElemType, Family, HalfTiles, PortableKernel, PvAccum, QkAccum,
};

fn check(case: Case) {
    let Some(client) = wgpu_client() else { return };
    let report = run_selected(&client, &case, None).expect("launch refused");
    println!("{case:?}\n  -> {report:?}");
    assert!(report.info.kernel.starts_with("portable_fma_vec_"), "{}", report.info.kernel);
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
    // Every row sees nothing; the empty K and V are one-vector buffers.
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

/// The packed-f16 kernel with one K/V stage and with two moves the same values through shared
/// memory, so both give the same bits. Ragged shapes, so both the full-tile and the
/// partial-tile loads run.
#[test]
fn half_kernel_split_kv_is_bit_identical() {
    let Some(client) = wgpu_client() else { return };
    let acc = Accumulation { qk: QkAccum::TwoStage, pv: PvAccum::F16PerTile };
    for case in [Case::new(127, 300, 64, true, ElemType::F16), Case::new(45, 97, 64, false, ElemType::F16)] {
        let PortableKernel::Half(selected) = select(&client, &case, acc, None).expect("selection") else {
            panic!("f16 accumulation must select the packed-f16 kernel");
        };
        let mut first: Option<common::Report> = None;
        for split_kv in [false, true] {
            let kernel = PortableKernel::Half(HalfTiles { split_kv, ..selected });
            let report = run_case(&client, &case, &kernel).expect("launch refused");
            println!("{case:?} split {split_kv}\n  -> {}: rel-L2 {:.2e}", report.info.kernel, report.o_rel_l2);
            assert_eq!(report.o_non_finite, 0, "{}: unwritten O", report.info.kernel);
            match &first {
                None => {
                    // The mode's own bound is checked against its emulation in the facade's
                    // tests; here the run must at least be close to the f64 reference.
                    assert!(report.o_rel_l2 < 1e-2, "{}: rel-L2 {}", report.info.kernel, report.o_rel_l2);
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

/// The prefetched K/V staging gives the same bits on every launch of the same kernel, and each
/// f16-accumulating mode selects the packed-f16 kernel and stays near the reference.
#[test]
fn half_kernel_modes_are_deterministic() {
    let Some(client) = wgpu_client() else { return };
    let case = Case::new(77, 150, 64, true, ElemType::F16);
    for acc in [
        Accumulation { qk: QkAccum::F16, pv: PvAccum::F32 },
        Accumulation { qk: QkAccum::TwoStage, pv: PvAccum::F32 },
        Accumulation { qk: QkAccum::F32, pv: PvAccum::F16PerTile },
    ] {
        let kernel = select(&client, &case, acc, Some(Family::Fma)).expect("selection");
        assert!(matches!(kernel, PortableKernel::Half(h) if h.accumulation == acc), "{kernel:?}");
        let a = run_case(&client, &case, &kernel).expect("launch refused");
        let b = run_case(&client, &case, &kernel).expect("launch refused");
        assert!(a.o_rel_l2 < 1e-2, "{}: rel-L2 {}", a.info.kernel, a.o_rel_l2);
        assert!(a.o.iter().zip(&b.o).all(|(x, y)| x.to_bits() == y.to_bits()), "{}: runs differ", a.info.kernel);
    }
}

#[test]
fn every_fitting_vec_tile_config() {
    let Some(client) = wgpu_client() else { return };
    let smem = client.properties().hardware.max_shared_memory_size;
    for (d, elem) in [(64, ElemType::F32), (64, ElemType::F16), (128, ElemType::F16), (256, ElemType::F16), (256, ElemType::F32)] {
        for &tiles in fma_vec_candidates(d) {
            if tiles.smem_bytes(d, d, elem.size_bytes() as u32) as usize > smem {
                continue;
            }
            let case = Case { q_heads: 1, ..Case::new(37, 75, d as usize, true, elem) };
            let report = run_case(&client, &case, &PortableKernel::Fma(tiles)).expect("launch refused");
            println!("{tiles}: {report:?}");
            assert!(report.info.kernel.contains("fma_vec"), "{}", report.info.kernel);
            report.assert_within(&case);
        }
    }
}
