//! The portable split-KV decode kernel through the public API on wgpu (mesa's llvmpipe in CI;
//! Vulkan on real GPUs) and CUDA (skipped without a GPU): O and LSE against the f64 reference
//! with the project's tolerances, one split (O written directly) and many (through the merge),
//! GQA, ragged and causal caches, BSHD; which problems Auto gives it and which it refuses.

mod common;

macro_rules! testgen_decode {
    ($runtime:ident, $device:expr) => {
        mod $runtime {
            use super::common::{check, check_plan, open};
            use quattn_cubecl::{decode_candidates, mma_decode_candidates, row_candidates, DecodeTiles, DecodeTiling, PortableKernel};
            use quattn::{AttentionProblem, Device, Family, KernelId, Layout, PortableKind, Precision, Strategy};

            const DECODE: Strategy = Strategy::PortableFamily(PortableKind::Decode);

            fn device() -> Device {
                $device
            }

            /// The float precisions the runtime has (bf16 is refused, typed, where it lacks it).
            fn precisions(s: &quattn::Session) -> Vec<Precision> {
                let p = AttentionProblem::new(1, 4, 1, 64).kv_heads(1).kv_len(600);
                [Precision::F32, Precision::F16_DEFAULT, Precision::BF16_DEFAULT]
                    .into_iter()
                    .filter(|&prec| match s.plan(&p, prec, DECODE) {
                        Ok(_) => true,
                        Err(quattn::Error::UnsupportedStrategy { reason, .. })
                            if prec == Precision::BF16_DEFAULT && reason.contains("bf16 is not supported") =>
                        {
                            false
                        }
                        Err(e) => panic!("{prec}: {e}"),
                    })
                    .collect()
            }

            /// The plan of `p` on the decode kernel with its split replaced by about `splits`
            /// splits of whole tiles (the launch checks that they cover the keys).
            fn forced(s: &quattn::Session, p: &AttentionProblem, prec: Precision, splits: u32) -> quattn::Plan {
                let plan = s.plan(&p.clone().with_lse(true), prec, DECODE).unwrap_or_else(|e| panic!("{p:?}: {e}"));
                let KernelId::Portable { kernel: PortableKernel::Decode(t), .. } = plan.kernel.clone() else {
                    panic!("not the decode kernel: {}", plan.kernel)
                };
                with_tiling(plan, p, t.tiling, splits)
            }

            /// `plan` on `tiling` with about `splits` splits of whole tiles.
            fn with_tiling(mut plan: quattn::Plan, p: &AttentionProblem, tiling: DecodeTiling, splits: u32) -> quattn::Plan {
                let KernelId::Portable { name, .. } = plan.kernel.clone() else { unreachable!() };
                let probe = DecodeTiles { tiling, splits: 1, keys_per_split: 0 };
                let bk = probe.bk() as usize;
                let tiles = p.kv_len.div_ceil(bk);
                let per_split = tiles.div_ceil(splits as usize);
                let d = DecodeTiles { tiling, splits: tiles.div_ceil(per_split) as u32, keys_per_split: (per_split * bk) as u32 };
                // Whole tiles may round the count down, never to one split from several.
                assert!(d.splits <= splits && (d.splits > 1) == (splits > 1), "{p:?}: {splits} splits -> {}", d.splits);
                plan.kernel = KernelId::Portable { kernel: PortableKernel::Decode(d), name };
                plan
            }

            #[test]
            fn matches_the_reference_with_one_split_and_many() {
                let Some(s) = open(device()) else { return };
                let shapes = [
                    // GQA 4, one position, a ragged cache (not a multiple of the tile).
                    AttentionProblem::new(2, 8, 1, 128).kv_heads(2).kv_len(1337),
                    // Causal, q_len 3, BSHD: the selftest's decode shape.
                    AttentionProblem::new(2, 8, 3, 128).kv_heads(2).kv_len(1500).causal(true).layout(Layout::Bshd),
                    // MHA rows (group 1), d 64, causal with q_len 16 (16 rows, ragged).
                    AttentionProblem::new(1, 2, 16, 64).kv_len(777).causal(true),
                    // 64 packed rows (group 8 x 8 positions), causal, BSHD.
                    AttentionProblem::new(1, 8, 8, 64).kv_heads(1).kv_len(600).causal(true).layout(Layout::Bshd),
                ];
                for prec in precisions(&s) {
                    for (i, p) in shapes.iter().enumerate() {
                        let tiles = p.kv_len.div_ceil(64) as u32;
                        for splits in [1u32, 3, tiles.min(7)] {
                            let plan = forced(&s, p, prec, splits);
                            check_plan(&s, &plan, 40 + i as u64);
                        }
                    }
                }
            }

            /// Every tiling on the shapes the row kernel takes (at most 8 packed rows): the
            /// portable strategy picks the row kernel, or on 16-bit inputs where the runtime has
            /// the manual MMA (CUDA) and the head dims are at most 128 the MMA kernel; and each
            /// tiling matches the reference with one split and many, at every head-dim layout of
            /// the row kernel's groups (d 64: 8 groups of 16 lanes; d 128: 4 of 32; d 256: 2 of
            /// 64) and both key tiles, and the MMA kernel's at d 64 and 128 (causal rows of
            /// several positions, BSHD strides, one row).
            #[test]
            fn row_kernel_and_tile_kernel_match_on_few_rows() {
                let Some(s) = open(device()) else { return };
                let shapes = [
                    // MQA-like: one row (group 1, q_len 1), d 128.
                    AttentionProblem::new(2, 3, 1, 128).kv_len(1111),
                    // GQA 8 at q_len 1, d 64, ragged.
                    AttentionProblem::new(1, 16, 1, 64).kv_heads(2).kv_len(2049),
                    // GQA 2 x q_len 3 = 6 rows, causal (every position its own diagonal), BSHD.
                    AttentionProblem::new(2, 4, 3, 128).kv_heads(2).kv_len(700).causal(true).layout(Layout::Bshd),
                    // d 256 (two groups of 64 lanes), GQA 4.
                    AttentionProblem::new(1, 4, 1, 256).kv_heads(1).kv_len(900),
                    // GQA 4 x q_len 2 = 8 rows, causal, d 128, ragged.
                    AttentionProblem::new(2, 8, 2, 128).kv_heads(2).kv_len(3001).causal(true),
                ];
                // Every float precision on the first shape, f16 (the decode type) on the others:
                // each case compiles its own kernels.
                let all = precisions(&s);
                for (i, p) in shapes.iter().enumerate() {
                    let precs = if i == 0 { all.clone() } else { vec![Precision::F16_DEFAULT] };
                    for prec in precs {
                        let plan = s.plan(&p.clone().with_lse(true), prec, Strategy::Portable).unwrap();
                        let KernelId::Portable { kernel: PortableKernel::Decode(t), .. } = plan.kernel.clone() else {
                            panic!("{prec} {p:?}: the portable strategy gave {}", plan.kernel)
                        };
                        let rows = (p.q_heads / p.kv_heads * p.q_len) as u32;
                        let (d, dv) = (p.head_dim as u32, p.head_dim as u32);
                        let mma = mma_decode_candidates(rows, d, dv, 2);
                        let mma_runs = matches!(t.tiling, DecodeTiling::Mma(_));
                        assert!(
                            matches!(t.tiling, DecodeTiling::Rows(_)) || (mma_runs && prec != Precision::F32 && !mma.is_empty()),
                            "{prec} {p:?}: {t}"
                        );
                        let mut tilings: Vec<DecodeTiling> = row_candidates(rows, d, dv).into_iter().map(DecodeTiling::Rows).collect();
                        if mma_runs {
                            tilings.extend(mma.into_iter().map(DecodeTiling::Mma));
                        }
                        assert!(tilings.len() >= 1, "{p:?}");
                        // The smallest tile kernel (16-key tiles), where it fits every runtime's 32 KiB.
                        let small = decode_candidates(rows, d, dv).into_iter().map(DecodeTiling::Tile).find(|&tiling| {
                            DecodeTiles { tiling, splits: 1, keys_per_split: 0 }.smem_bytes(d, dv, 4) <= 32 * 1024
                        });
                        tilings.extend(small);
                        for tiling in tilings {
                            for splits in [1u32, 4] {
                                let plan = with_tiling(plan.clone(), p, tiling, splits);
                                check_plan(&s, &plan, 60 + i as u64);
                            }
                        }
                    }
                }
            }

            /// The split the plan chose by itself, through Auto.
            #[test]
            fn auto_plans_it_for_decode_shapes_and_matches() {
                let Some(s) = open(device()) else { return };
                let p = AttentionProblem::new(2, 8, 2, 64).kv_heads(2).kv_len(2100).causal(true).layout(Layout::Bshd);
                for prec in precisions(&s) {
                    let plan = s.plan(&p.clone().with_lse(true), prec, Strategy::Portable).unwrap();
                    assert_eq!(plan.family(), Family::Portable(PortableKind::Decode), "{prec}: {}", plan.kernel);
                    check(&s, p.clone(), prec, Strategy::Portable, 7);
                }
            }

            /// Splits that a position cannot see (keys above its causal diagonal) hold an empty
            /// state and must weigh nothing in the merge. kv 520, q_len 40: position 0 sees keys
            /// ≤ 480, and with 5 splits of 128 keys the last one (keys 512..520) is empty for
            /// positions 0..31.
            #[test]
            fn splits_a_position_cannot_see_weigh_nothing() {
                let Some(s) = open(device()) else { return };
                let p = AttentionProblem::new(1, 2, 40, 64).kv_len(520).causal(true);
                for prec in precisions(&s) {
                    for splits in [1u32, 5] {
                        let plan = forced(&s, &p, prec, splits);
                        check_plan(&s, &plan, 3);
                    }
                }
            }

            /// Shapes the family refuses are typed refusals, and Auto moves on; a decode shape
            /// with a score modifier is the family's (its modifier variant).
            #[test]
            fn refuses_other_shapes_so_auto_moves_on_and_takes_modifiers() {
                let Some(s) = open(device()) else { return };
                let prec = Precision::F16_DEFAULT;
                let refused = [
                    // 65 rows per KV head.
                    AttentionProblem::new(1, 5, 13, 64).kv_heads(1).kv_len(4096),
                    // A short cache.
                    AttentionProblem::new(1, 8, 1, 64).kv_heads(2).kv_len(511),
                    // Prefill.
                    AttentionProblem::new(1, 2, 1024, 64).kv_len(1024).causal(true),
                ];
                for p in refused {
                    let e = s.plan(&p, prec, DECODE).expect_err(&format!("{p:?}"));
                    // Typed: the strategy with the family's reason.
                    match &e {
                        quattn::Error::UnsupportedStrategy { reason, .. } => {
                            assert!(reason.contains("not decode-shaped") || reason.contains("below 512"), "{p:?}: {e}")
                        }
                        _ => panic!("{p:?}: {e}"),
                    }
                    let plan = s.plan(&p, prec, Strategy::Portable).unwrap();
                    assert_ne!(plan.family(), Family::Portable(PortableKind::Decode), "{p:?}");
                }
                let capped = AttentionProblem::new(1, 8, 1, 64).kv_heads(2).kv_len(4096).softcap(30.0);
                for strategy in [DECODE, Strategy::Portable] {
                    let plan = s.plan(&capped, prec, strategy).unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
                    assert_eq!(plan.family(), Family::Portable(PortableKind::Decode), "{strategy:?}");
                }
                // f16 accumulation belongs to the packed-f16 kernel.
                let p = AttentionProblem::new(1, 8, 1, 64).kv_heads(2).kv_len(4096);
                let plan = s.plan(&p, Precision::F16 { qk: quattn::QkAccum::F32, pv: quattn::PvAccum::F16PerTile }, Strategy::Portable).unwrap();
                assert_ne!(plan.family(), Family::Portable(PortableKind::Decode));
            }

            /// Keys whose scores jump far above the running max in the middle of a warp's or
            /// unit's walk (the second half of the cache with K scaled by 6: scores several
            /// times the lazy-rescale threshold above the first half's max) make the kernels
            /// rescale what they have accumulated; without that rescale the first half would
            /// keep its old weight. Every decode tiling the runtime has, one split and several.
            #[test]
            fn a_max_that_jumps_mid_walk_rescales_the_accumulators() {
                let Some(s) = open(device()) else { return };
                let p = AttentionProblem::new(2, 8, 1, 128).kv_heads(2).kv_len(4096).with_lse(true);
                let (q, mut k, v) = quattn::inputs::qkv(&p, 77);
                let st = p.k_strides();
                for b in 0..p.batch {
                    for h in 0..p.kv_heads {
                        for j in p.kv_len / 2..p.kv_len {
                            k[st.offset(b, h, j)..][..p.head_dim].iter_mut().for_each(|x| *x *= 6.0);
                        }
                    }
                }
                for prec in precisions(&s) {
                    let plan = s.plan(&p, prec, Strategy::Portable).unwrap();
                    let KernelId::Portable { kernel: PortableKernel::Decode(t), .. } = plan.kernel.clone() else {
                        panic!("{prec}: the portable strategy gave {}", plan.kernel)
                    };
                    let dt = prec.input_dtype();
                    let (qr, kr, vr) = (quattn::HostSlice::F32(&q).rounded_to(dt), quattn::HostSlice::F32(&k).rounded_to(dt), quattn::HostSlice::F32(&v).rounded_to(dt));
                    let r = quattn::reference::attention_f64(&p, &qr, &kr, &vr).unwrap();
                    let tol = quattn::metrics::Tolerance::for_precision(prec);
                    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
                    for splits in [1u32, 4] {
                        let plan = with_tiling(plan.clone(), &p, t.tiling, splits);
                        let out = s.run(&plan, &qr, &kr, &vr).unwrap();
                        let m = quattn::metrics::ErrorMetrics::compare(&out.o, &r.o);
                        assert!(tol.accepts(&m, ref_max), "{} {prec} {splits} splits: {m:?} outside {tol:?}", plan.kernel);
                    }
                }
            }

            /// A split that does not cover the keys is refused at launch, typed.
            #[test]
            fn a_split_that_misses_keys_is_refused() {
                let Some(s) = open(device()) else { return };
                let p = AttentionProblem::new(1, 4, 1, 64).kv_heads(1).kv_len(1000);
                let mut plan = forced(&s, &p, Precision::F32, 4);
                let KernelId::Portable { kernel: PortableKernel::Decode(t), name } = plan.kernel.clone() else { unreachable!() };
                plan.kernel =
                    KernelId::Portable { kernel: PortableKernel::Decode(DecodeTiles { splits: t.splits - 1, ..t }), name };
                let (q, k, v) = quattn::inputs::qkv(&plan.problem, 1);
                let e = s.run(&plan, &q, &k, &v).expect_err("a short split");
                assert!(e.to_string().contains("does not cover"), "{e}");
            }
        }
    };
}

testgen_decode!(wgpu, Device::Wgpu(quattn::WgpuAdapter::Default));
testgen_decode!(cuda, Device::Cuda(0));
