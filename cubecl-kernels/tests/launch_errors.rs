//! Refusals: every one happens on the host, before anything is enqueued, and never panics.
#![cfg(feature = "wgpu")]

mod common;

use common::wgpu_client;
use quattn_cubecl::{
    launch, select, Accumulation, AttentionShape, Dtype, Family, FmaVecTiles, LaunchError, PortableKernel, PvAccum,
    QkAccum,
};
use quattn_core::Layout;

fn buffers(
    client: &cubecl::prelude::ComputeClient<cubecl::wgpu::WgpuRuntime>,
    bytes: usize,
) -> [cubecl::server::Handle; 4] {
    [client.empty(bytes), client.empty(bytes), client.empty(bytes), client.empty(bytes)]
}

#[test]
fn refusals() {
    let Some(client) = wgpu_client() else { return };
    let ok = AttentionShape::contiguous(Layout::Bhsd, 1, 2, 1, 16, 16, 64, false);
    let [q, k, v, o] = buffers(&client, 2 * 16 * 64 * 4);
    let kernel = select(&client, &ok, Dtype::F32, Accumulation::default(), None).unwrap().kernel;
    assert!(matches!(kernel, PortableKernel::Fma(_)), "{kernel:?}");
    let run = |shape: &AttentionShape, dtype, kernel: &PortableKernel, k: &cubecl::server::Handle, lse| {
        launch(&client, kernel, shape, dtype, &q, k, &v, &o, lse)
    };
    assert!(run(&ok, Dtype::F32, &kernel, &k, None).unwrap().launched);

    let bad_dim = AttentionShape { head_dim: 80, v_head_dim: 80, ..ok };
    assert!(matches!(
        select(&client, &bad_dim, Dtype::F32, Accumulation::default(), None),
        Err(LaunchError::UnsupportedHeadDim { head_dim: 80, .. })
    ));
    assert!(matches!(run(&bad_dim, Dtype::F32, &kernel, &k, None), Err(LaunchError::UnsupportedHeadDim { head_dim: 80, .. })));

    let bad_groups = AttentionShape { q_heads: 3, kv_heads: 2, ..ok };
    assert!(matches!(run(&bad_groups, Dtype::F32, &kernel, &k, None), Err(LaunchError::InvalidProblem { .. })));

    let bad_scale = AttentionShape { scale: f32::NAN, ..ok };
    assert!(matches!(run(&bad_scale, Dtype::F32, &kernel, &k, None), Err(LaunchError::InvalidProblem { .. })));

    let huge_len = AttentionShape { q_len: 1 << 33, ..ok };
    assert!(matches!(run(&huge_len, Dtype::F32, &kernel, &k, None), Err(LaunchError::TooLarge { what: "q_len", .. })));

    let small = client.empty(16);
    assert!(matches!(run(&ok, Dtype::F32, &kernel, &small, None), Err(LaunchError::BufferTooSmall { tensor: "k", .. })));

    // An empty K still needs one vector of buffer: 4 elements.
    let no_keys = AttentionShape { kv_len: 0, ..ok };
    let tiny = client.empty(4);
    assert!(matches!(run(&no_keys, Dtype::F32, &kernel, &tiny, None), Err(LaunchError::BufferTooSmall { tensor: "k", .. })));
    assert!(run(&no_keys, Dtype::F32, &kernel, &small, None).is_ok());

    let with_lse = AttentionShape { write_lse: true, ..ok };
    assert!(matches!(run(&with_lse, Dtype::F32, &kernel, &k, None), Err(LaunchError::InvalidProblem { .. })));

    // A row start off a 4-element boundary: the vector kernels refuse it by name (the caller
    // realigns), at selection and at launch.
    let mut unaligned = ok;
    unaligned.q.seq = 66;
    unaligned.q.head = 66 * 16;
    unaligned.q.batch = 2 * 66 * 16;
    let err = select(&client, &unaligned, Dtype::F32, Accumulation::default(), None).unwrap_err();
    assert!(matches!(err, LaunchError::UnalignedLayout { .. }), "{err}");
    assert!(quattn_cubecl::vector_layout_ok(&unaligned).is_err());
    assert!(quattn_cubecl::vector_layout_ok(&ok).is_ok());
    assert!(matches!(run(&unaligned, Dtype::F32, &kernel, &k, None), Err(LaunchError::UnalignedLayout { .. })));

    // A hand-built tiling that cannot run is refused, not replaced.
    let huge_vec = PortableKernel::Fma(FmaVecTiles { bq: 256, bk: 256, tr: 16, tc: 8, stage_f32: true });
    assert!(matches!(run(&ok, Dtype::F32, &huge_vec, &k, None), Err(LaunchError::SharedMemoryExceeded { .. })));
    let uneven = PortableKernel::Fma(FmaVecTiles { bq: 30, bk: 32, tr: 8, tc: 8, stage_f32: true });
    assert!(matches!(run(&ok, Dtype::F32, &uneven, &k, None), Err(LaunchError::InvalidTiles { .. })));

    // Forced families that cannot run say which and why.
    let f16_acc = Accumulation { qk: QkAccum::F16, pv: PvAccum::F32 };
    for (dtype, acc, family) in [
        (Dtype::F32, Accumulation::default(), Family::Cmma),
        (Dtype::F32, Accumulation::default(), Family::Mma),
        (Dtype::F16, f16_acc, Family::Cmma),
        (Dtype::F32, f16_acc, Family::Fma),
    ] {
        match select(&client, &ok, dtype, acc, Some(family)) {
            Err(LaunchError::FamilyUnavailable { family: f, reason }) => {
                assert_eq!(f, family);
                assert!(!reason.is_empty());
            }
            other => panic!("{dtype} {acc:?} {family}: {other:?}"),
        }
    }

    // Without a forced family, f32 passes over both matrix families, saying why.
    let chosen = select(&client, &ok, Dtype::F32, Accumulation::default(), None).unwrap();
    assert_eq!(chosen.passed_over.iter().map(|(f, _)| *f).collect::<Vec<_>>(), vec![Family::Mma, Family::Cmma]);

    // Whatever the adapter lacks must be refused by name, not fail inside the runtime.
    let bf16_usage = client.features().type_usage(cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16).into());
    if bf16_usage.is_empty() {
        assert!(matches!(run(&ok, Dtype::Bf16, &kernel, &k, None), Err(LaunchError::UnsupportedDtype { dtype: Dtype::Bf16, .. })));
    }

    // Display is readable, not Debug.
    let msg = LaunchError::UnsupportedHeadDim { head_dim: 80, v_head_dim: 80, supported: &[64] }.to_string();
    assert!(msg.contains("80") && !msg.contains("UnsupportedHeadDim"), "{msg}");
}

#[test]
fn reports_llvmpipe_capabilities() {
    // Not an assertion: records what the adapter offers, for the crate docs.
    let Some(client) = wgpu_client() else { return };
    let props = client.properties();
    let f = &props.features;
    let has = |k| !f.type_usage(cubecl::ir::ElemType::Float(k).into()).is_empty();
    println!(
        "adapter: f16={} bf16={} planes={:?} plane_size={}..{} smem={} cmma={}",
        has(cubecl::ir::FloatKind::F16),
        has(cubecl::ir::FloatKind::BF16),
        f.plane,
        props.hardware.plane_size_min,
        props.hardware.plane_size_max,
        props.hardware.max_shared_memory_size,
        f.matmul.cmma.len()
    );
}

/// Score modifiers: bad parameters and a kernel without a modifier variant are refused before
/// anything is enqueued; modifiers that change nothing launch the plain kernel.
#[test]
fn modifier_refusals() {
    use quattn_cubecl::{launch_modified, ScoreMods};
    let Some(client) = wgpu_client() else { return };
    let ok = AttentionShape::contiguous(Layout::Bhsd, 1, 2, 1, 16, 16, 64, false);
    let [q, k, v, o] = buffers(&client, 2 * 16 * 64 * 4);
    let kernel = select(&client, &ok, Dtype::F32, Accumulation::default(), None).unwrap().kernel;
    let run = |mods: &ScoreMods<'_>, kernel: &PortableKernel| launch_modified(&client, kernel, &ok, Dtype::F32, mods, &q, &k, &v, &o, None);
    let nan = [f32::NAN, 0.0];
    let inf = [f32::INFINITY, 0.0];
    let one = [0.0f32];
    for bad in [
        ScoreMods { softcap: Some(f32::NAN), ..ScoreMods::default() },
        ScoreMods { softcap: Some(0.0), ..ScoreMods::default() },
        ScoreMods { window_left: Some(u32::MAX), ..ScoreMods::default() },
        ScoreMods { sinks: Some(&one), ..ScoreMods::default() },
        ScoreMods { sinks: Some(&nan), ..ScoreMods::default() },
        ScoreMods { sinks: Some(&inf), ..ScoreMods::default() },
        ScoreMods { alibi_slopes: Some(&nan), ..ScoreMods::default() },
    ] {
        assert!(matches!(run(&bad, &kernel), Err(LaunchError::InvalidProblem { .. })), "{bad:?}");
    }
    // Only the vector FMA kernel has a modifier variant.
    let half = PortableKernel::Half(quattn_cubecl::HalfTiles {
        tiles: quattn_cubecl::fma_half_candidates(64)[0],
        accumulation: Accumulation { qk: QkAccum::F16, pv: PvAccum::F16PerTile },
        split_kv: false,
    });
    let window = ScoreMods { window_left: Some(4), window_right: Some(0), ..ScoreMods::default() };
    assert!(matches!(run(&window, &half), Err(LaunchError::WrongKernel { .. })));
    // Top-left alignment of a non-causal square problem changes nothing: the plain kernel runs.
    let same = ScoreMods { top_left: true, ..ScoreMods::default() };
    assert!(same.is_none(&ok));
    assert!(run(&same, &kernel).unwrap().launched);
    assert!(!window.is_none(&ok));
}
