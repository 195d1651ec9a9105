//! The kernels on CUDA (only built with `--features cuda`; needs an NVIDIA GPU and NVRTC).
#![cfg(feature = "cuda")]

mod common;

use common::{cuda_client, run_case, run_selected, Case, Layout};
use quattn_cubecl::{Dtype as ElemType, Family, PortableKernel};

fn check(case: Case, family: Family) {
    let Some(client) = cuda_client() else { return };
    let report = run_selected(&client, &case, Some(family)).expect("launch refused");
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
    for elem in [ElemType::F32, ElemType::F16, ElemType::Bf16] {
        for case in cases(elem) {
            check(case, Family::Fma);
        }
    }
}

#[test]
fn cmma_on_cuda() {
    for elem in [ElemType::F16, ElemType::Bf16] {
        for case in cases(elem) {
            check(case, Family::Cmma);
        }
    }
}

#[test]
fn mma_on_cuda() {
    for elem in [ElemType::F16, ElemType::Bf16] {
        for case in cases(elem) {
            check(case, Family::Mma);
        }
    }
}

/// Every tiling of the mma table (the forced ones too), not only the first that fits.
#[test]
fn mma_every_tiling_on_cuda() {
    use quattn_cubecl::mma_candidates;
    let Some(client) = cuda_client() else { return };
    for elem in [ElemType::F16, ElemType::Bf16] {
        for case in cases(elem) {
            for &tiles in mma_candidates(case.head_dim.max(case.v_head_dim) as u32) {
                let report = run_case(&client, &case, &PortableKernel::Mma(tiles)).expect("launch refused");
                report.assert_within(&case);
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
        let kernel = common::select(&client, &case, Default::default(), None).expect("selection");
        assert_eq!(kernel.family(), Family::Mma, "{kernel:?}");
        for family in [Family::Cmma, Family::Fma] {
            let kernel = common::select(&client, &case, Default::default(), Some(family)).expect("selection");
            assert_eq!(kernel.family(), family, "{kernel:?}");
            run_case(&client, &case, &kernel).expect("launch refused").assert_within(&case);
        }
    }
}

/// CubeCL's `position_of_nth` for m16n8k16 (f16 inputs, f32 accumulator) on the device is the
/// PTX ISA layout the mma kernel's fragment reuse relies on (`kernel/mma.rs` layout tests
/// check the kernel against the same formulas on the host): for every lane, A element `i` at
/// row `g + 8 ((i / 2) % 2)`, column `2t + i % 2 + 8 (i / 4)`; B element `i` at row
/// `2t + i % 2 + 8 (i / 2)`, column `g`; accumulator element `i` at row `g + 8 (i / 2)`,
/// column `2t + i % 2` (g = lane / 4, t = lane % 4).
#[test]
fn mma_fragment_layout_on_cuda() {
    use cubecl::prelude::*;

    let Some(client) = cuda_client() else { return };
    let out = client.empty(32 * 32 * 4);
    // SAFETY: one plane writes 32 x 32 u32, exactly the buffer.
    unsafe {
        probe::positions::launch::<cubecl::cuda::CudaRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(32),
            ArrayArg::from_raw_parts(out.clone(), 32 * 32),
        )
    };
    let bytes = client.read_one(out).expect("read back");
    let got: Vec<u32> = bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    for lane in 0..32u32 {
        let (g, t) = (lane / 4, lane % 4);
        let at = |k: usize| (got[lane as usize * 32 + 2 * k], got[lane as usize * 32 + 2 * k + 1]);
        for i in 0..8u32 {
            assert_eq!(at(i as usize), (g + 8 * ((i / 2) % 2), 2 * t + i % 2 + 8 * (i / 4)), "A lane {lane} elem {i}");
        }
        for i in 0..4u32 {
            assert_eq!(at(8 + i as usize), (2 * t + i % 2 + 8 * (i / 2), g), "B lane {lane} elem {i}");
            assert_eq!(at(12 + i as usize), (g + 8 * (i / 2), 2 * t + i % 2), "acc lane {lane} elem {i}");
        }
    }
}

/// The device side of `mma_fragment_layout_on_cuda`: one plane writes, per lane, the (row, col)
/// CubeCL gives each A, B and accumulator element.
mod probe {
    use cubecl::cmma::{MatrixIdent, MmaDefinition};
    use cubecl::prelude::*;

    #[cube(launch)]
    pub fn positions(out: &mut Array<u32>) {
        let def = MmaDefinition::<half::f16, half::f16, f32>::new(16usize, 8usize, 16usize);
        let lane = UNIT_POS_PLANE;
        let base = lane as usize * 32;
        #[unroll]
        for i in 0..8usize {
            let (r, c) = def.position_of_nth(lane, i as u32, MatrixIdent::A);
            out[base + 2 * i] = r;
            out[base + 2 * i + 1] = c;
        }
        #[unroll]
        for i in 0..4usize {
            let (r, c) = def.position_of_nth(lane, i as u32, MatrixIdent::B);
            out[base + 16 + 2 * i] = r;
            out[base + 16 + 2 * i + 1] = c;
            let (r, c) = def.position_of_nth(lane, i as u32, MatrixIdent::Accumulator);
            out[base + 24 + 2 * i] = r;
            out[base + 24 + 2 * i + 1] = c;
        }
    }
}
