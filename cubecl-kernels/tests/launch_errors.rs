//! Refusals: every one happens on the host, before anything is enqueued, and never panics.
#![cfg(feature = "wgpu")]

mod common;

use common::wgpu_client;
use quattn_cubecl::{
    launch, launch_with, AttentionArgs, ElemType, FmaTiles, FmaVecTiles, LaunchError, LaunchOptions, Variant,
};

fn buffers(
    client: &cubecl::prelude::ComputeClient<cubecl::wgpu::WgpuRuntime>,
    bytes: usize,
) -> [cubecl::server::Handle; 4] {
    [client.empty(bytes), client.empty(bytes), client.empty(bytes), client.empty(bytes)]
}

#[test]
fn refusals() {
    let Some(client) = wgpu_client() else { return };
    let ok = AttentionArgs::bhsd(1, 2, 1, 16, 16, 64, false);
    let [q, k, v, o] = buffers(&client, 2 * 16 * 64 * 4);

    let bad_dim = AttentionArgs { head_dim: 80, v_head_dim: 80, ..ok };
    assert!(matches!(
        launch(&client, &bad_dim, ElemType::F32, &q, &k, &v, &o, None),
        Err(LaunchError::UnsupportedHeadDim { head_dim: 80, .. })
    ));

    let bad_groups = AttentionArgs { q_heads: 3, kv_heads: 2, ..ok };
    assert!(matches!(
        launch(&client, &bad_groups, ElemType::F32, &q, &k, &v, &o, None),
        Err(LaunchError::InvalidProblem { .. })
    ));

    let bad_scale = AttentionArgs { scale: f32::NAN, ..ok };
    assert!(matches!(
        launch(&client, &bad_scale, ElemType::F32, &q, &k, &v, &o, None),
        Err(LaunchError::InvalidProblem { .. })
    ));

    let small = client.empty(16);
    assert!(matches!(
        launch(&client, &ok, ElemType::F32, &q, &small, &v, &o, None),
        Err(LaunchError::BufferTooSmall { tensor: "k", .. })
    ));

    let with_lse = AttentionArgs { write_lse: true, ..ok };
    assert!(matches!(
        launch(&client, &with_lse, ElemType::F32, &q, &k, &v, &o, None),
        Err(LaunchError::InvalidProblem { .. })
    ));

    let huge = FmaTiles { bq: 256, bk: 256, tr: 16, tc: 8 };
    let forced = LaunchOptions {
        variant: Variant::PortableFmaScalar,
        fma_tiles: Some(huge),
        ..LaunchOptions::default()
    };
    assert!(matches!(
        launch_with(&client, &ok, ElemType::F32, &forced, &q, &k, &v, &o, None),
        Err(LaunchError::SharedMemoryExceeded { .. })
    ));

    let uneven = FmaTiles { bq: 30, bk: 32, tr: 8, tc: 8 };
    let forced = LaunchOptions { fma_tiles: Some(uneven), ..forced };
    assert!(matches!(
        launch_with(&client, &ok, ElemType::F32, &forced, &q, &k, &v, &o, None),
        Err(LaunchError::InvalidTiles { .. })
    ));

    // A pinned vector tiling that cannot run is refused, not silently replaced.
    let huge_vec = FmaVecTiles { bq: 256, bk: 256, tr: 16, tc: 8, stage_f32: true };
    let forced_vec = LaunchOptions {
        variant: Variant::PortableFma,
        fma_vec_tiles: Some(huge_vec),
        ..LaunchOptions::default()
    };
    assert!(matches!(
        launch_with(&client, &ok, ElemType::F32, &forced_vec, &q, &k, &v, &o, None),
        Err(LaunchError::VariantUnavailable { .. })
    ));

    // Whatever the adapter lacks must be refused by name, not fail inside the runtime.
    let bf16_usage = client.features().type_usage(cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16).into());
    if bf16_usage.is_empty() {
        assert!(matches!(
            launch(&client, &ok, ElemType::Bf16, &q, &k, &v, &o, None),
            Err(LaunchError::UnsupportedElemType { elem: ElemType::Bf16, .. })
        ));
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
