//! The portable CubeCL kernels through the public API, one suite instantiated per runtime:
//! wgpu (mesa's llvmpipe in CI; Vulkan on real GPUs) and CUDA (skipped without a GPU).

mod common;

macro_rules! testgen_attention {
    ($runtime:ident, $device:expr) => {
        mod $runtime {
            use super::common::{check, open};
            use quattn::{AttentionProblem, Device, Layout, Precision, Strategy};

            fn device() -> Device {
                $device
            }

            fn precisions(s: &quattn::Session) -> Vec<Precision> {
                // bf16 only where the runtime has it; the plan says so with a typed error.
                [Precision::F32, Precision::F16_DEFAULT, Precision::BF16_DEFAULT]
                    .into_iter()
                    .filter(|&p| match s.plan(&AttentionProblem::new(1, 1, 1, 64), p, Strategy::Portable) {
                        Ok(_) => true,
                        Err(quattn::Error::UnsupportedPrecision { .. }) if p == Precision::BF16_DEFAULT => {
                            println!("bf16 not offered by {:?}", s.info());
                            false
                        }
                        Err(e) => panic!("{p}: {e}"),
                    })
                    .collect()
            }

            #[test]
            fn every_head_dim() {
                let Some(s) = open(device()) else { return };
                for d in [32, 64, 96, 128, 256] {
                    for causal in [false, true] {
                        let p = AttentionProblem::new(1, 8, 17, d).kv_heads(2).kv_len(45).causal(causal);
                        check(&s, p, Precision::F16_DEFAULT, Strategy::Portable, d as u64);
                    }
                }
            }

            #[test]
            fn ragged_lengths_and_dtypes() {
                let Some(s) = open(device()) else { return };
                for prec in precisions(&s) {
                    for (q_len, kv_len) in [(1, 77), (17, 30), (127, 127), (300, 213), (40, 7)] {
                        for causal in [false, true] {
                            let p = AttentionProblem::new(1, 2, q_len, 64).kv_len(kv_len).causal(causal);
                            check(&s, p, prec, Strategy::Portable, (q_len * 7 + kv_len) as u64);
                        }
                    }
                }
            }

            #[test]
            fn gqa_and_layouts() {
                let Some(s) = open(device()) else { return };
                for prec in precisions(&s) {
                    for layout in [Layout::Bhsd, Layout::Bshd] {
                        for causal in [false, true] {
                            let p = AttentionProblem::new(2, 8, 33, 128).kv_heads(2).kv_len(70).causal(causal).layout(layout);
                            check(&s, p, prec, Strategy::Portable, 5);
                        }
                    }
                }
            }

            #[test]
            fn mqa_long_rows_and_scale() {
                let Some(s) = open(device()) else { return };
                let p = AttentionProblem::new(1, 4, 64, 64).kv_heads(1).kv_len(600).scale(0.3);
                check(&s, p, Precision::F32, Strategy::Portable, 11);
                let p = AttentionProblem::new(1, 2, 300, 32).kv_len(300).causal(true).layout(Layout::Bshd);
                check(&s, p, Precision::F16_DEFAULT, Strategy::Auto, 12);
            }

            #[test]
            fn unsupported_head_dim_is_a_typed_error() {
                let Some(s) = open(device()) else { return };
                let p = AttentionProblem::new(1, 1, 8, 80);
                match s.plan(&p, Precision::F16_DEFAULT, Strategy::Portable) {
                    Err(quattn::Error::UnsupportedHeadDim { head_dim: 80, supported, .. }) => assert!(supported.contains(&128)),
                    other => panic!("expected UnsupportedHeadDim, got {other:?}"),
                }
            }
        }
    };
}

testgen_attention!(wgpu, Device::Wgpu(quattn::WgpuAdapter::Default));
testgen_attention!(cuda, Device::Cuda(0));
