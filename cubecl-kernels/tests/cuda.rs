//! The kernels on CUDA (only built with `--features cuda`; needs an NVIDIA GPU and NVRTC).
#![cfg(feature = "cuda")]

mod common;

use common::{cuda_client, run_case, Case, Layout};
use quattn_cubecl::{ElemType, LaunchOptions, Variant};

fn check(case: Case, options: &LaunchOptions) {
    let Some(client) = cuda_client() else { return };
    let report = run_case(&client, &case, options).expect("launch refused");
    println!("{case:?}\n  -> {report:?}");
    report.assert_within(&case);
}

fn cases(elem: ElemType) -> Vec<Case> {
    vec![
        Case::new(17, 33, 64, false, elem),
        Case { q_heads: 1, ..Case::new(300, 300, 64, true, elem) },
        Case::new(127, 17, 32, true, elem),
        Case::new(1, 300, 128, true, elem),
        Case::new(77, 200, 96, true, elem),
        Case { q_heads: 1, ..Case::new(70, 90, 256, true, elem) },
        Case { v_head_dim: 128, ..Case::new(17, 45, 64, true, elem) },
        Case { batch: 2, q_heads: 8, kv_heads: 2, layout: Layout::Bshd, ..Case::new(129, 257, 128, true, elem) },
        Case::new(5, 0, 32, false, elem),
    ]
}

#[test]
fn fma_on_cuda() {
    for lazy_rescale in [true, false] {
        let options = LaunchOptions { variant: Variant::PortableFma, lazy_rescale, ..Default::default() };
        for elem in [ElemType::F32, ElemType::F16, ElemType::Bf16] {
            for case in cases(elem) {
                check(case, &options);
            }
        }
    }
}

#[test]
fn cmma_on_cuda() {
    for lazy_rescale in [true, false] {
        let options = LaunchOptions { variant: Variant::Cmma, lazy_rescale, ..Default::default() };
        for elem in [ElemType::F16, ElemType::Bf16] {
            for case in cases(elem) {
                check(case, &options);
            }
        }
    }
}

#[test]
fn mma_on_cuda() {
    for lazy_rescale in [true, false] {
        let options = LaunchOptions { variant: Variant::Mma, lazy_rescale, ..Default::default() };
        for elem in [ElemType::F16, ElemType::Bf16] {
            for case in cases(elem) {
                check(case, &options);
            }
        }
    }
}

/// Every tiling of the mma table (the forced ones too), not only the first that fits.
#[test]
fn mma_every_tiling_on_cuda() {
    use quattn_cubecl::mma_candidates;
    for elem in [ElemType::F16, ElemType::Bf16] {
        for case in cases(elem) {
            for &tiles in mma_candidates(case.head_dim.max(case.v_head_dim)) {
                let options = LaunchOptions { variant: Variant::Mma, mma_tiles: Some(tiles), ..Default::default() };
                check(case, &options);
            }
        }
    }
}

/// Auto picks the mma kernel for f16/bf16 on CUDA (sm_80+), and cmma / FMA stay forceable.
#[test]
fn auto_prefers_mma_on_cuda() {
    let Some(client) = cuda_client() else { return };
    for elem in [ElemType::F16, ElemType::Bf16] {
        let case = Case::new(64, 64, 128, false, elem);
        let report = run_case(&client, &case, &LaunchOptions::default()).expect("launch refused");
        assert_eq!(report.info.variant, Variant::Mma, "{report:?}");
        for variant in [Variant::Cmma, Variant::PortableFma] {
            let report = run_case(&client, &case, &LaunchOptions { variant, ..Default::default() }).expect("launch refused");
            assert_eq!(report.info.variant, variant, "{report:?}");
            report.assert_within(&case);
        }
    }
}
