//! Paged KV cache on the CPU backend: attention through the block table against the f64
//! reference and against the same sequences stored contiguously, `append_kv`, the NaN policy
//! through pages, and the typed errors of bad tables.

mod common;

use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::reference::attention_f64;
use quattn::{inputs, AttentionProblem, Device, Error, HostSlice, Layout, PagedKv, PortableKind, Precision, Session, Strategy, WgpuAdapter};

fn cpu() -> Session {
    Session::new(Device::Cpu).unwrap()
}

/// `p` with a shuffled paged cache of `lens` keys per sequence.
fn paged(p: AttentionProblem, page_size: usize, lens: &[usize], seed: u64) -> AttentionProblem {
    p.paged_kv(inputs::paged_kv(page_size, lens, 1, 3, seed))
}

/// Runs a paged problem on the CPU and checks O and LSE against the f64 reference on the
/// rounded inputs; returns (O, LSE, rounded q, k, v).
#[allow(clippy::type_complexity)]
fn check(p: &AttentionProblem, precision: Precision, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    check_on(&cpu(), p, precision, seed)
}

/// [`check`] on session `s` with `Strategy::Auto`.
#[allow(clippy::type_complexity)]
fn check_on(s: &Session, p: &AttentionProblem, precision: Precision, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let p = p.clone().with_lse(true);
    let plan = s.plan(&p, precision, Strategy::Auto).unwrap_or_else(|e| panic!("plan {p:?}: {e}"));
    let (q, k, v) = inputs::qkv(&p, seed);
    assert_eq!(k.len(), p.paged.as_ref().unwrap().pool_elems(p.kv_heads, p.head_dim));
    let dt = precision.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let out = s.run(&plan, &q, &k, &v).unwrap();
    let r = attention_f64(&p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{precision} {p:?}: {m:?}");
    let lse = out.lse.clone().unwrap();
    let lm = compare_lse(&lse, &r.lse).expect("LSE infinities agree");
    assert!(lm.max_abs <= tol.max_abs_rel, "{precision}: LSE {lm:?}");
    (out.o, lse, q, k, v)
}

#[test]
fn cpu_matches_the_reference_through_shuffled_pages() {
    for (i, &ps) in quattn::PAGE_SIZES.iter().enumerate() {
        // Ragged lengths: an empty sequence, one shorter than a page, page multiples, others.
        let lens = [ps * 3 + 5, 1, 0, ps * 2, 300 + i];
        let base = AttentionProblem::new(lens.len(), 8, 1, 64).kv_heads(2);
        for (precision, q_len, causal, layout) in
            [(Precision::F32, 1, false, Layout::Bhsd), (Precision::F16_DEFAULT, 4, true, Layout::Bshd), (Precision::BF16_DEFAULT, 7, true, Layout::Bhsd)]
        {
            let mut p = base.clone().causal(causal).layout(layout);
            p.q_len = q_len;
            let p = paged(p, ps, &lens, 10 + i as u64);
            let (o, lse, ..) = check(&p, precision, 20 + i as u64);
            // The empty sequence: O = 0, LSE = -inf on every row (the CPU starts from NaN).
            for h in 0..p.q_heads {
                for r in 0..q_len {
                    assert_eq!(lse[(2 * p.q_heads + h) * q_len + r], f32::NEG_INFINITY);
                    assert!(o[p.o_strides().offset(2, h, r)..][..64].iter().all(|&x| x == 0.0));
                }
            }
        }
    }
}

/// Each sequence of a paged run gives bit for bit what the same keys give as a contiguous
/// one-sequence problem: the table is read as it says, and each sequence's causal alignment is
/// against its own length.
#[test]
fn paged_equals_contiguous_sequence_by_sequence() {
    let lens = [100usize, 33, 64, 1];
    let p = paged(AttentionProblem::new(lens.len(), 4, 3, 32).kv_heads(2).causal(true).with_lse(true), 16, &lens, 5);
    let s = cpu();
    let (q, k, v) = inputs::qkv(&p, 6);
    let out = s.run(&s.plan(&p, Precision::F32, Strategy::Auto).unwrap(), &q, &k, &v).unwrap();
    let pg = p.paged.clone().unwrap();
    let (hk, d) = (p.kv_heads, p.head_dim);
    for (b, &n) in lens.iter().enumerate() {
        let one = AttentionProblem::new(1, 4, 3, 32).kv_heads(2).kv_len(n).causal(true).with_lse(true);
        // Q of sequence b (BHSD: contiguous per batch entry), K/V gathered key by key.
        let qb = &q[p.q_strides().offset(b, 0, 0)..][..one.q_len_elems()];
        let mut kb = vec![0.0f32; one.k_len_elems()];
        let mut vb = vec![0.0f32; one.v_len_elems()];
        for h in 0..hk {
            for j in 0..n {
                let page = pg.block_table[b * pg.max_pages + j / 16] as usize;
                let src = ((page * 16 + j % 16) * hk + h) * d;
                kb[one.k_strides().offset(0, h, j)..][..d].copy_from_slice(&k[src..][..d]);
                vb[one.v_strides().offset(0, h, j)..][..d].copy_from_slice(&v[src..][..d]);
            }
        }
        let want = s.run(&s.plan(&one, Precision::F32, Strategy::Auto).unwrap(), qb, &kb, &vb).unwrap();
        assert_eq!(&out.o[p.o_strides().offset(b, 0, 0)..][..one.o_len_elems()], &want.o[..], "sequence {b}");
        assert_eq!(&out.lse.as_ref().unwrap()[b * 12..][..12], &want.lse.unwrap()[..], "sequence {b}");
    }
}

#[test]
fn modifiers_read_positions_per_sequence() {
    let lens = [200usize, 57, 129];
    let p = paged(AttentionProblem::new(3, 4, 5, 64).kv_heads(1).causal(true), 32, &lens, 8)
        .window(40, 0)
        .softcap(20.0)
        .alibi_slopes(AttentionProblem::standard_alibi_slopes(4))
        .sinks(vec![0.5f32, -1.0, 2.0, f32::NEG_INFINITY]);
    check(&p, Precision::F32, 9);
}

#[test]
fn append_kv_then_attend_equals_the_cache_filled_at_once() {
    let (hk, d) = (2usize, 64usize);
    let lens = [40usize, 17, 0];
    let new_tokens = 30;
    let final_lens: Vec<usize> = lens.iter().map(|n| n + new_tokens).collect();
    // Pages for the final lengths; the lengths start short.
    let full = inputs::paged_kv(16, &final_lens, 0, 2, 11);
    let start = PagedKv::new(16, full.num_pages, full.block_table.clone(), lens.iter().map(|&n| n as i32).collect::<Vec<_>>());
    let pool = full.pool_elems(hk, d);
    let k_full = inputs::normal_with_outliers(pool, 12);
    let v_full = inputs::normal_with_outliers(pool, 13);
    // The pools hold the first `lens` keys; the rest is garbage (NaN) until appended.
    let (mut k, mut v) = (vec![f32::NAN; pool], vec![f32::NAN; pool]);
    let (mut k_new, mut v_new) = (vec![0.0f32; 3 * new_tokens * hk * d], vec![0.0f32; 3 * new_tokens * hk * d]);
    for (b, &n) in lens.iter().enumerate() {
        for h in 0..hk {
            for j in 0..n + new_tokens {
                let src = full.offset(b, h, j, hk, d);
                if j < n {
                    k[src..][..d].copy_from_slice(&k_full[src..][..d]);
                    v[src..][..d].copy_from_slice(&v_full[src..][..d]);
                } else {
                    let dst = ((b * new_tokens + j - n) * hk + h) * d;
                    k_new[dst..][..d].copy_from_slice(&k_full[src..][..d]);
                    v_new[dst..][..d].copy_from_slice(&v_full[src..][..d]);
                }
            }
        }
    }
    let grown = start.append(hk, d, d, &mut k, &mut v, &k_new, &v_new, new_tokens).unwrap();
    assert_eq!(&grown.seq_lens[..], &final_lens.iter().map(|&n| n as i32).collect::<Vec<_>>()[..]);
    let p = AttentionProblem::new(3, 4, 1, d).kv_heads(hk).paged_kv(grown);
    let q = inputs::normal_with_outliers(p.q_len_elems(), 14);
    let s = cpu();
    let plan = s.plan(&p, Precision::F32, Strategy::Auto).unwrap();
    let got = s.run(&plan, &q, &k, &v).unwrap();
    let want = s.run(&plan, &q, &k_full, &v_full).unwrap();
    assert_eq!(got.o, want.o);
    assert!(got.o.iter().all(|x| x.is_finite()));
}

#[test]
fn append_kv_refuses_missing_pages_and_writes_nothing() {
    let (hk, d) = (1usize, 8usize);
    let cache = inputs::paged_kv(16, &[10, 30], 0, 1, 3);
    let pool = cache.pool_elems(hk, d);
    let (mut k, mut v) = (vec![1.0f32; pool], vec![2.0f32; pool]);
    let new = vec![7.0f32; 2 * 5 * hk * d];
    // Sequence 1 has 2 pages (32 keys): 30 + 5 = 35 needs a third column the table lacks.
    match cache.append(hk, d, d, &mut k, &mut v, &new, &new, 5) {
        Err(Error::InvalidPagedKv { reason }) => assert!(reason.contains("sequence 1"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(k.iter().all(|&x| x == 1.0) && v.iter().all(|&x| x == 2.0));
    // A table with a free column (-1) for the third page: the entry is missing.
    let wide = inputs::paged_kv(16, &[10, 30], 1, 1, 3);
    let (mut k, mut v) = (vec![1.0f32; wide.pool_elems(hk, d)], vec![2.0f32; wide.pool_elems(hk, d)]);
    match wide.append(hk, d, d, &mut k, &mut v, &new, &new, 5) {
        Err(Error::BlockTableEntry { sequence: 1, index: 2, entry: -1, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(k.iter().all(|&x| x == 1.0));
    // Two sequences sharing a page they both append into.
    let shared = PagedKv::new(16, 2, vec![0, 1, 0, 1], vec![3, 3]);
    assert!(matches!(shared.append(hk, d, d, &mut vec![0.0; 32 * d], &mut vec![0.0; 32 * d], &vec![0.0; 2 * d], &vec![0.0; 2 * d], 1), Err(Error::InvalidPagedKv { .. })));
    // Wrong buffer lengths.
    assert!(matches!(wide.append(hk, d, d, &mut k[1..].to_vec(), &mut v, &new[..2 * d], &new[..2 * d], 1), Err(Error::BufferLength { .. })));
}

#[test]
fn bad_tables_are_typed_errors() {
    let s = cpu();
    let p = AttentionProblem::new(2, 4, 1, 64).kv_heads(2);
    let plan = |pg: PagedKv| s.plan(&p.clone().paged_kv(pg), Precision::F32, Strategy::Auto);
    for ps in [0usize, 8, 48, 512] {
        match plan(PagedKv::new(ps, 4, vec![0, 1, 2, 3], vec![5, 5])) {
            Err(Error::UnsupportedPageSize { page_size, supported }) => assert_eq!((page_size, supported), (ps, quattn::PAGE_SIZES.to_vec())),
            other => panic!("page size {ps}: {other:?}"),
        }
    }
    // Entries a sequence reads: out of the pool, negative.
    for (entry, at) in [(4, 1usize), (-1, 2), (i32::MAX, 0)] {
        let mut table = vec![0, 1, 2, 3];
        table[at] = entry;
        match plan(PagedKv::new(16, 4, table, vec![20, 17])) {
            Err(Error::BlockTableEntry { sequence, index, entry: e, num_pages: 4 }) => assert_eq!((sequence * 2 + index, e), (at, entry)),
            other => panic!("{entry} at {at}: {other:?}"),
        }
    }
    // An entry past a sequence's length is never read: anything goes.
    plan(PagedKv::new(16, 4, vec![0, -7, 2, 99], vec![16, 1])).unwrap();
    // Lengths: beyond the table, negative, a count that is not the batch.
    assert!(matches!(plan(PagedKv::new(16, 4, vec![0, 1, 2, 3], vec![33, 1])), Err(Error::InvalidPagedKv { .. })));
    assert!(matches!(plan(PagedKv::new(16, 4, vec![0, 1, 2, 3], vec![-1, 3])), Err(Error::InvalidPagedKv { .. }) | Err(Error::ZeroSize { .. })));
    assert!(matches!(plan(PagedKv::new(16, 4, vec![0, 1, 2], vec![3, 3, 3])), Err(Error::InvalidPagedKv { .. })));
    assert!(matches!(plan(PagedKv::new(16, 0, vec![0, 1], vec![3, 3])), Err(Error::InvalidPagedKv { .. })));
    // kv_len changed after paged_kv, explicit strides.
    let mut q = p.clone().paged_kv(PagedKv::new(16, 4, vec![0, 1, 2, 3], vec![5, 5]));
    q.kv_len = 32;
    assert!(matches!(s.plan(&q, Precision::F32, Strategy::Auto), Err(Error::InvalidPagedKv { .. })));
    let mut q = p.clone().paged_kv(PagedKv::new(16, 4, vec![0, 1, 2, 3], vec![5, 5]));
    q.strides = Some(q.tensor_strides());
    assert!(matches!(s.plan(&q, Precision::F32, Strategy::Auto), Err(Error::InvalidPagedKv { .. })));
    // A pool buffer of the contiguous size is the wrong length.
    let q = p.clone().paged_kv(PagedKv::new(16, 4, vec![0, 1, 2, 3], vec![5, 5]));
    let plan = s.plan(&q, Precision::F32, Strategy::Auto).unwrap();
    let x = vec![0.0f32; q.q_len_elems()];
    let short = vec![0.0f32; 2 * 2 * 5 * 64];
    assert!(matches!(s.run(&plan, &x, &short, &short), Err(Error::BufferLength { tensor: quattn::TensorName::K, expected, .. }) if expected == 4 * 16 * 2 * 64));
    // Paths that do not read pages refuse with a typed error.
    assert!(matches!(s.plan(&q, Precision::F32, Strategy::Reference), Err(Error::UnsupportedPagedKv { .. })));
    assert!(matches!(s.plan(&q, Precision::FP8_DEFAULT, Strategy::Auto), Err(Error::UnsupportedPagedKv { .. })));
}

/// The NaN policy through pages: a NaN in a page no sequence reads changes nothing; a NaN in a
/// key one sequence holds makes exactly that sequence's rows that see the key NaN.
#[test]
fn nan_policy_follows_the_table() {
    let lens = [40usize, 40];
    let p = paged(AttentionProblem::new(2, 2, 3, 32).causal(true).with_lse(true), 16, &lens, 21);
    let pg = p.paged.clone().unwrap();
    let s = cpu();
    let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    let (q, mut k, v) = inputs::qkv(&p, 22);
    let clean = s.run(&plan, &q, &k, &v).unwrap();
    // A spare page (never in the table).
    let used: Vec<i32> = pg.block_table.iter().copied().filter(|&e| e >= 0).collect();
    let spare = (0..pg.num_pages as i32).find(|x| !used.contains(x)).unwrap() as usize;
    k[spare * 16 * p.kv_heads * 32] = f32::NAN;
    let out = s.run(&plan, &q, &k, &v).unwrap();
    assert_eq!(out.o, clean.o);
    // Key 38 of sequence 1, head 0: rows 1 and 2 of sequence 1 (causal: row i sees keys <= 37 + i) are NaN.
    k[pg.offset(1, 0, 38, p.kv_heads, 32) + 5] = f32::INFINITY;
    let out = s.run(&plan, &q, &k, &v).unwrap();
    let os = p.o_strides();
    for b in 0..2 {
        for h in 0..2 {
            for i in 0..3 {
                let row = &out.o[os.offset(b, h, i)..][..32];
                let poisoned = b == 1 && h == 0 && i >= 1;
                assert_eq!(row.iter().all(|x| x.is_nan()), poisoned, "b{b} h{h} i{i}");
                if !poisoned {
                    assert_eq!(row, &clean.o[os.offset(b, h, i)..][..32]);
                }
            }
        }
    }
}

#[test]
fn reference_gathers_like_a_contiguous_cache() {
    // The f64 reference of a paged problem equals the reference of each sequence laid out
    // contiguously (same arithmetic after the gather).
    let lens = [50usize, 3];
    let p = paged(AttentionProblem::new(2, 2, 2, 16).causal(true), 16, &lens, 31);
    let (q, k, v) = inputs::qkv(&p, 32);
    let r = attention_f64(&p, &q, &k, &v).unwrap();
    let pg = p.paged.clone().unwrap();
    for (b, &n) in lens.iter().enumerate() {
        let one = AttentionProblem::new(1, 2, 2, 16).kv_len(n).causal(true);
        let (mut kb, mut vb) = (vec![0.0; one.k_len_elems()], vec![0.0; one.v_len_elems()]);
        for h in 0..2 {
            for j in 0..n {
                let src = pg.offset(b, h, j, 2, 16);
                kb[one.k_strides().offset(0, h, j)..][..16].copy_from_slice(&k[src..][..16]);
                vb[one.v_strides().offset(0, h, j)..][..16].copy_from_slice(&v[src..][..16]);
            }
        }
        let rb = attention_f64(&one, &q[b * one.q_len_elems()..][..one.q_len_elems()], &kb, &vb).unwrap();
        assert_eq!(&r.o[b * one.o_len_elems()..][..one.o_len_elems()], &rb.o[..]);
        assert_eq!(&r.lse[b * 4..][..4], &rb.lse[..]);
    }
}

/// The portable decode kernels read the pages (wgpu; llvmpipe in CI): Auto picks the decode
/// family, the row kernel (up to 8 packed rows: any page size, a table entry per key) and the
/// tile kernel (more rows: key tiles that fit in a page) match the f64 reference through
/// shuffled pages with ragged lengths (an empty sequence, a one-key one, long ones that the
/// split cuts, empty splits for the short ones), causal per sequence; the empty sequence gives
/// O = 0 and LSE = -inf.
#[test]
fn portable_decode_kernels_read_pages() {
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let lens = [700, 1, 0, 130, 2100];
    let cases = [
        (16, 1, false, Precision::F32, true),
        (64, 2, true, Precision::F16_DEFAULT, true),
        (256, 5, true, Precision::F16_DEFAULT, false),
        (16, 5, false, Precision::F32, false),
    ];
    for (i, (ps, q_len, causal, precision, rows_kernel)) in cases.into_iter().enumerate() {
        let mut p = AttentionProblem::new(lens.len(), 8, q_len, 64).kv_heads(2).causal(causal);
        if i % 2 == 1 {
            p = p.layout(Layout::Bshd);
        }
        let p = paged(p, ps, &lens, 40 + i as u64);
        let plan = s.plan(&p.clone().with_lse(true), precision, Strategy::Auto).unwrap();
        assert_eq!(plan.family(), quattn::Family::Portable(PortableKind::Decode), "{}", plan.kernel_name());
        let quattn::KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Decode(t), .. } = plan.kernel.clone() else {
            panic!("case {i}: {}", plan.kernel)
        };
        assert_eq!(matches!(t.tiling, quattn_cubecl::DecodeTiling::Rows(_)), rows_kernel, "case {i}: {t}");
        if let quattn_cubecl::DecodeTiling::Tile(tiles) = t.tiling {
            assert!(tiles.bk as usize <= ps, "case {i}: {t}");
        }
        let (o, lse, ..) = check_on(&s, &p, precision, 50 + i as u64);
        for h in 0..p.q_heads {
            for r in 0..q_len {
                assert_eq!(lse[(2 * p.q_heads + h) * q_len + r], f32::NEG_INFINITY, "case {i}");
                assert!(o[p.o_strides().offset(2, h, r)..][..64].iter().all(|&x| x == 0.0), "case {i}");
            }
        }
    }
}

/// The other portable families do not read pages: a paged problem forced onto one is a typed
/// refusal naming it, never a contiguous read of the pools; with score modifiers Auto takes the
/// decode family, which reads the pages with them.
#[test]
fn other_portable_kernels_refuse_paged_problems() {
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let p = paged(AttentionProblem::new(2, 4, 1, 64).kv_heads(2), 16, &[40, 7], 3);
    for family in [PortableKind::Fma, PortableKind::Mma] {
        match s.plan(&p, Precision::F16_DEFAULT, Strategy::PortableFamily(family)) {
            Err(Error::UnsupportedPagedKv { kernel }) => assert!(kernel.contains("portable"), "{kernel}"),
            other => panic!("{family:?}: {:?}", other.map(|x| x.kernel_name())),
        }
    }
    let windowed = p.clone().window(8, 0);
    let plan = s.plan(&windowed, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    assert_eq!(plan.family(), quattn::Family::Portable(PortableKind::Decode), "{}", plan.kernel_name());
}

/// `append_kv` on CubeCL handles (wgpu; llvmpipe in CI) writes the pools bit for bit as the host
/// append does (f16 rows, GQA heads, a sequence crossing pages, an empty one), leaves every
/// other pool row untouched, returns the grown lengths, and the portable decode kernel then reads
/// the grown cache as the CPU does; a missing page is a typed error with nothing enqueued.
#[test]
fn cubecl_append_kv_matches_the_host_append() {
    use half::f16;
    use quattn::cubecl::wgpu::WgpuRuntime;
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let (hk, d, dv) = (2usize, 64usize, 32usize);
    let lens = [40usize, 17, 0];
    let new_tokens = 30;
    let final_lens: Vec<usize> = lens.iter().map(|n| n + new_tokens).collect();
    let full = inputs::paged_kv(16, &final_lens, 0, 2, 31);
    let start = PagedKv::new(16, full.num_pages, full.block_table.clone(), lens.iter().map(|&n| n as i32).collect::<Vec<_>>());
    let half = |n: usize, seed: u64| inputs::normal_with_outliers(n, seed).into_iter().map(f16::from_f32).collect::<Vec<_>>();
    let (k_pool, v_pool) = (half(full.pool_elems(hk, d), 32), half(full.pool_elems(hk, dv), 33));
    let (k_new, v_new) = (half(3 * new_tokens * hk * d, 34), half(3 * new_tokens * hk * dv, 35));
    let (mut k_host, mut v_host) = (k_pool.clone(), v_pool.clone());
    let grown = start.append(hk, d, dv, &mut k_host, &mut v_host, &k_new, &v_new, new_tokens).unwrap();

    let up = |x: &[f16]| client.create_from_slice(bytemuck::cast_slice(x));
    let (kp, vp, kn, vn) = (up(&k_pool), up(&v_pool), up(&k_new), up(&v_new));
    let got = s.append_kv_cubecl::<WgpuRuntime>(&start, hk, d, dv, quattn::Dtype::F16, [&kp, &vp], [&kn, &vn], new_tokens).unwrap();
    assert_eq!(got, grown);
    let read = |h| bytemuck::pod_collect_to_vec::<u8, f16>(&client.read_one(h).unwrap());
    let (k_dev, v_dev) = (read(kp.clone()), read(vp.clone()));
    assert!(k_dev.iter().zip(&k_host).all(|(a, b)| a.to_bits() == b.to_bits()), "K pools differ");
    assert!(v_dev.iter().zip(&v_host).all(|(a, b)| a.to_bits() == b.to_bits()), "V pools differ");
    assert_ne!(k_host, k_pool, "the append wrote nothing");

    // Decode through the grown cache on the device equals the CPU kernel on the host pools.
    let p = AttentionProblem::new(3, 4, 1, d).v_head_dim(dv).kv_heads(hk).paged_kv(got);
    let q = half(p.q_len_elems(), 36);
    let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    assert_eq!(plan.family(), quattn::Family::Portable(PortableKind::Decode), "{}", plan.kernel_name());
    let o = client.empty(p.o_len_elems() * 2);
    let qh = up(&q);
    s.run_cubecl::<WgpuRuntime>(&plan, quattn::CubeclTensors { q: &qh, k: &kp, v: &vp, o: &o, lse: None }).unwrap();
    let o_dev: Vec<f32> = read(o).iter().map(|x| x.to_f32()).collect();
    let f32s = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let r = attention_f64(&p, &f32s(&q), &f32s(&k_host), &f32s(&v_host)).unwrap();
    let m = ErrorMetrics::compare(&o_dev, &r.o);
    let tol = Tolerance::for_precision(Precision::F16_DEFAULT);
    assert!(tol.accepts(&m, r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()))), "{m:?}");

    // A table one page short for the new keys: a typed error, the pools as they were.
    let short: Vec<i32> = full.block_table.iter().enumerate().map(|(i, &x)| if i == 2 { -1 } else { x }).collect();
    let bad = PagedKv::new(16, full.num_pages, short, lens.iter().map(|&n| n as i32).collect::<Vec<_>>());
    let (kp2, vp2) = (up(&k_pool), up(&v_pool));
    let err = s.append_kv_cubecl::<WgpuRuntime>(&bad, hk, d, dv, quattn::Dtype::F16, [&kp2, &vp2], [&kn, &vn], new_tokens).unwrap_err();
    assert!(matches!(err, Error::BlockTableEntry { .. } | Error::InvalidPagedKv { .. }), "{err}");
    assert!(read(kp2).iter().zip(&k_pool).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// Runs `plan` (a paged problem that returns the LSE) on CubeCL handles of `s` (wgpu) whose O
/// and LSE hold NaN beforehand, Q/K/V in the plan's input type, and checks O and the LSE against
/// the f64 reference on the rounded inputs; returns them (O in f32).
fn check_poisoned(s: &Session, plan: &quattn::Plan, seed: u64) -> (Vec<f32>, Vec<f32>) {
    use half::{bf16, f16};
    use quattn::cubecl::wgpu::WgpuRuntime;
    let p = &plan.problem;
    assert!(p.return_lse);
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let dt = plan.precision.input_dtype();
    let (q, k, v) = inputs::qkv(p, seed);
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let bytes = |x: &[f32]| -> Vec<u8> {
        match dt {
            quattn::Dtype::F32 => bytemuck::cast_slice(x).to_vec(),
            quattn::Dtype::F16 => bytemuck::cast_slice(&x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>()).to_vec(),
            quattn::Dtype::Bf16 => bytemuck::cast_slice(&x.iter().map(|&a| bf16::from_f32(a)).collect::<Vec<_>>()).to_vec(),
        }
    };
    let up = |x: &[f32]| client.create_from_slice(&bytes(x));
    let (qh, kh, vh) = (up(&q), up(&k), up(&v));
    let oh = up(&vec![f32::NAN; p.o_len_elems()]);
    let lh = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
    s.run_cubecl::<WgpuRuntime>(plan, quattn::CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) })
        .unwrap_or_else(|e| panic!("{}: {e}", plan.kernel_name()));
    let raw = client.read_one(oh).unwrap();
    let o: Vec<f32> = match dt {
        quattn::Dtype::F32 => bytemuck::pod_collect_to_vec(&raw),
        quattn::Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(&raw).iter().map(|x| x.to_f32()).collect(),
        quattn::Dtype::Bf16 => bytemuck::pod_collect_to_vec::<u8, bf16>(&raw).iter().map(|x| x.to_f32()).collect(),
    };
    let lse: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(lh).unwrap());
    let r = attention_f64(p, &q, &k, &v).unwrap();
    assert!(o.iter().all(|x| x.is_finite()), "{}: a row left unwritten or non-finite", plan.kernel_name());
    let m = ErrorMetrics::compare(&o, &r.o);
    let tol = Tolerance::for_precision(plan.precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{} {p:?}: {m:?}", plan.kernel_name());
    let lm = compare_lse(&lse, &r.lse).unwrap_or_else(|| panic!("{}: LSE infinities differ", plan.kernel_name()));
    assert!(lm.max_abs <= tol.max_abs_rel, "{}: LSE {lm:?}", plan.kernel_name());
    (o, lse)
}

/// `plan` (on the portable decode kernel) with one split: O and the LSE written by the decode
/// cubes directly, without the merge.
fn one_split(mut plan: quattn::Plan) -> quattn::Plan {
    let quattn::KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Decode(t), name } = plan.kernel.clone() else {
        panic!("not the decode kernel: {}", plan.kernel)
    };
    let keys = (plan.problem.kv_len.max(1) as u32).div_ceil(t.bk()) * t.bk();
    let t = quattn_cubecl::DecodeTiles { splits: 1, keys_per_split: keys, ..t };
    plan.kernel = quattn::KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Decode(t), name };
    plan
}

/// Prefill and chunked prefill against a paged cache on the portable decode family (wgpu;
/// llvmpipe in CI): more than 64 packed rows per KV head (GQA 4 at q_len 100 and 300), in blocks
/// of the query tile, some crossing from one head's positions to the next and the last one
/// padded. Against the f64 reference through shuffled pages of 16 and 64 keys with ragged
/// lengths (an empty sequence, a one-key one, one shorter than q_len, whose first positions see
/// no key when causal, long ones the split cuts), causal per sequence and not, BHSD and BSHD,
/// with the split the plan chose (through the merge) and with one split (written directly).
#[test]
fn portable_decode_kernels_run_paged_prefill() {
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let lens = [700usize, 1, 0, 130, 2100, 57];
    let cases = [
        (16, 100, true, Precision::F16_DEFAULT, Layout::Bhsd),
        (64, 300, false, Precision::F32, Layout::Bshd),
        (64, 100, true, Precision::F32, Layout::Bshd),
        (16, 300, true, Precision::F16_DEFAULT, Layout::Bhsd),
    ];
    for (i, (ps, q_len, causal, precision, layout)) in cases.into_iter().enumerate() {
        let mut p = AttentionProblem::new(lens.len(), 8, q_len, 64).kv_heads(2).causal(causal).layout(layout);
        p = paged(p, ps, &lens, 60 + i as u64).with_lse(true);
        let plan = s.plan(&p, precision, Strategy::Auto).unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(plan.family(), quattn::Family::Portable(PortableKind::Decode), "case {i}: {}", plan.kernel_name());
        let quattn::KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Decode(t), .. } = plan.kernel.clone() else {
            panic!("case {i}: {}", plan.kernel)
        };
        let quattn_cubecl::DecodeTiling::Tile(tiles) = t.tiling else { panic!("case {i}: {t}") };
        let rows = 4 * q_len as u64;
        assert!(tiles.bk as usize <= ps && t.row_blocks(rows) == rows.div_ceil(tiles.bq as u64) && t.row_blocks(rows) > 1, "case {i}: {t}");
        // The merge runs: wgpu reports no SM count, and 128 SMs leave room for several splits.
        assert!(t.splits > 1, "case {i}: {t}");
        for plan in [plan.clone(), one_split(plan)] {
            let (o, lse) = check_poisoned(&s, &plan, 70 + i as u64);
            // The empty sequence, and (causal) the positions of the 57-key one before its first
            // key: O = 0, LSE = -inf.
            for h in 0..p.q_heads {
                for r in 0..q_len {
                    for (b, empty) in [(2, true), (5, causal && r + 57 < q_len)] {
                        let l = lse[(b * p.q_heads + h) * q_len + r];
                        let row = &o[p.o_strides().offset(b, h, r)..][..64];
                        assert_eq!(empty, l == f32::NEG_INFINITY, "case {i} b{b} h{h} r{r}: {l}");
                        if empty {
                            assert!(row.iter().all(|&x| x == 0.0), "case {i} b{b} h{h} r{r}");
                        }
                    }
                }
            }
        }
    }
}

/// A paged problem of more than 64 packed rows per KV head plans on the portable decode family
/// (on wgpu no other kernel reads pages): its tile kernel in blocks of 64 rows, key tiles within
/// a page. The same shape on a contiguous cache stays with the per-head kernels under Auto, and
/// the decode family refuses it there.
#[test]
fn paged_prefill_selects_the_portable_decode_family() {
    use quattn::cubecl::wgpu::WgpuRuntime;
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    for (q_len, q_heads, ps) in [(17usize, 8usize, 32usize), (100, 8, 16), (300, 8, 64), (2048, 2, 256)] {
        let lens = [3000usize, 40];
        let p = paged(AttentionProblem::new(2, q_heads, q_len, 128).kv_heads(2).causal(true), ps, &lens, 3);
        let rows = (q_heads / 2 * q_len) as u64;
        assert!(rows > 64);
        let kernel = quattn_cubecl::select_paged(&client, &p.shape(), quattn::Dtype::F16, ps as u32).unwrap_or_else(|e| panic!("q_len {q_len}: {e}"));
        let quattn_cubecl::PortableKernel::Decode(t) = kernel else { panic!("q_len {q_len}: {kernel:?}") };
        let quattn_cubecl::DecodeTiling::Tile(tiles) = t.tiling else { panic!("q_len {q_len}: {t}") };
        assert!(tiles.bq == 64 && tiles.bk as usize <= ps && t.row_blocks(rows) == rows.div_ceil(64), "q_len {q_len}: {t}");
        let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap_or_else(|e| panic!("q_len {q_len}: {e}"));
        assert_eq!(plan.family(), quattn::Family::Portable(PortableKind::Decode), "q_len {q_len}: {}", plan.kernel_name());

        let dense = AttentionProblem::new(2, q_heads, q_len, 128).kv_heads(2).kv_len(3000).causal(true);
        let plan = s.plan(&dense, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        assert_ne!(plan.family(), quattn::Family::Portable(PortableKind::Decode), "q_len {q_len}: {}", plan.kernel_name());
        match s.plan(&dense, Precision::F16_DEFAULT, Strategy::PortableFamily(PortableKind::Decode)) {
            Err(Error::UnsupportedStrategy { reason, .. }) => assert!(reason.contains("not decode-shaped"), "{reason}"),
            other => panic!("q_len {q_len}: {:?}", other.map(|x| x.kernel_name())),
        }
    }
}

/// Paged prefill with score modifiers (a window and sinks, GQA 4 at q_len 100: 400 packed rows
/// per KV head, ragged lengths, one sequence shorter than q_len, whose first positions see no
/// key): the CPU kernel matches the f64 reference with each sequence's window aligned at its
/// own length, and so does the portable decode family on wgpu (Auto's choice, where no other
/// kernel reads pages: the tile kernel in row blocks, its split over the window's keys, and
/// with one split), its outputs poisoned beforehand; then ALiBi with top-left causal
/// alignment and softcap, which moves the shorter sequences' rows.
#[test]
fn paged_prefill_with_modifiers_runs_on_the_cpu_and_on_wgpu() {
    let lens = [700usize, 57, 300];
    let p = paged(AttentionProblem::new(3, 8, 100, 64).kv_heads(2).causal(true), 32, &lens, 12)
        .window(48, 0)
        .sinks(vec![0.5f32, -1.0, 2.0, f32::NEG_INFINITY, 0.0, 1.5, -3.0, 4.0]);
    check(&p, Precision::F32, 13);
    let alibi = paged(AttentionProblem::new(3, 8, 100, 64).kv_heads(2).causal(true), 64, &lens, 14)
        .alibi_slopes(AttentionProblem::standard_alibi_slopes(8))
        .softcap(10.0)
        .causal_align(quattn::CausalAlign::TopLeft);
    check(&alibi, Precision::F32, 15);
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    for (i, p) in [p, alibi].into_iter().enumerate() {
        let plan = s.plan(&p.clone().with_lse(true), Precision::F16_DEFAULT, Strategy::Auto).unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(plan.family(), quattn::Family::Portable(PortableKind::Decode), "case {i}: {}", plan.kernel_name());
        let quattn::KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Decode(t), .. } = plan.kernel.clone() else { unreachable!() };
        assert!(matches!(t.tiling, quattn_cubecl::DecodeTiling::Tile(_)) && t.row_blocks(400) > 1, "case {i}: {t}");
        for plan in [plan.clone(), one_split(plan)] {
            let (o, lse) = check_poisoned(&s, &plan, 16 + i as u64);
            // Bottom-right, the 57-key sequence's positions before its first key see nothing.
            for h in 0..8 {
                for r in 0..100 {
                    let empty = i == 0 && r + 57 < 100;
                    assert_eq!(lse[(8 + h) * 100 + r] == f32::NEG_INFINITY, empty, "case {i} h{h} r{r}");
                    if empty {
                        assert!(o[p.o_strides().offset(1, h, r)..][..64].iter().all(|&x| x == 0.0), "case {i} h{h} r{r}");
                    }
                }
            }
        }
    }
}

/// The portable backend keeps a plan's block table on the device between calls (wgpu; llvmpipe
/// in CI). On one set of Q and pool handles: two decode calls with one plan, then a plan over a
/// new `PagedKv` (the same pool's pages dealt to the sequences in another order), then the first
/// plan again, and the second through the host path; each O (poisoned with NaN) and LSE against
/// the f64 reference of its own table. The second table's answer differs from the first's, so a
/// stale table on the device could not pass.
#[test]
fn portable_decode_follows_a_new_block_table() {
    use half::f16;
    use quattn::cubecl::wgpu::WgpuRuntime;
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let lens = [300usize, 45, 129];
    let first = inputs::paged_kv(16, &lens, 1, 2, 61);
    let second = inputs::paged_kv(16, &lens, 1, 2, 62);
    assert_eq!((first.num_pages, first.max_pages, &first.seq_lens), (second.num_pages, second.max_pages, &second.seq_lens));
    assert_ne!(first.block_table, second.block_table);
    let base = AttentionProblem::new(lens.len(), 4, 1, 64).kv_heads(2).with_lse(true);
    let (p1, p2) = (base.clone().paged_kv(first), base.paged_kv(second));
    let precision = Precision::F16_DEFAULT;
    let (plan1, plan2) = (s.plan(&p1, precision, Strategy::Auto).unwrap(), s.plan(&p2, precision, Strategy::Auto).unwrap());
    assert_eq!(plan1.family(), quattn::Family::Portable(PortableKind::Decode), "{}", plan1.kernel_name());
    let (q, k, v) = inputs::qkv(&p1, 63);
    let dt = precision.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let up = |x: &[f32]| client.create_from_slice(bytemuck::cast_slice(&x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>()));
    let (qh, kh, vh) = (up(&q), up(&k), up(&v));
    let tol = Tolerance::for_precision(precision);
    let judge = |what: &str, p: &AttentionProblem, o: &[f32], lse: &[f32]| {
        let r = attention_f64(p, &q, &k, &v).unwrap();
        assert!(o.iter().all(|x| x.is_finite()), "{what}: a row left unwritten or non-finite");
        let m = ErrorMetrics::compare(o, &r.o);
        assert!(tol.accepts(&m, r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()))), "{what}: {m:?}");
        let lm = compare_lse(lse, &r.lse).unwrap_or_else(|| panic!("{what}: LSE infinities differ"));
        assert!(lm.max_abs <= tol.max_abs_rel, "{what}: LSE {lm:?}");
    };
    let on_handles = |plan: &quattn::Plan| -> (Vec<f32>, Vec<f32>) {
        let oh = up(&vec![f32::NAN; plan.problem.o_len_elems()]);
        let lh = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; plan.problem.lse_len_elems()]));
        s.run_cubecl::<WgpuRuntime>(plan, quattn::CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) }).unwrap();
        let o = bytemuck::pod_collect_to_vec::<u8, f16>(&client.read_one(oh).unwrap()).iter().map(|x| x.to_f32()).collect();
        (o, bytemuck::pod_collect_to_vec(&client.read_one(lh).unwrap()))
    };
    let mut outs = Vec::new();
    for (i, plan) in [&plan1, &plan1, &plan2, &plan1].into_iter().enumerate() {
        let (o, lse) = on_handles(plan);
        judge(&format!("call {i}"), &plan.problem, &o, &lse);
        outs.push(o);
    }
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], outs[3]);
    let m = ErrorMetrics::compare(&outs[2], &outs[0].iter().map(|&x| x as f64).collect::<Vec<_>>());
    assert!(m.rel_l2 > 0.1, "the two tables give the same answer: {m:?}");
    let host = s.run(&plan2, &q, &k, &v).unwrap();
    judge("host path", &p2, &host.o, host.lse.as_ref().unwrap());
}

/// The CUDA device-tensor path keeps a plan's tables in the stream's scratch between calls. On
/// one stream, enqueued back to back with no synchronization between them: a plan twice, a plan
/// over a new block table (the same pool's pages dealt in another order), a plan over that block
/// table's `Arc` with other lengths (only the lengths change on the device), then the first plan
/// again; each O and LSE (poisoned with NaN) against the f64 reference of its own table. Skips
/// without a CUDA device.
#[cfg(feature = "cuda")]
#[test]
fn cuda_device_tensors_follow_new_tables_on_one_stream() {
    use half::f16;
    use quattn::cudarc::driver::CudaContext;
    use quattn::{CudaTensor, CudaTensorMut};
    let Some(s) = common::open(Device::Cuda(0)) else { return };
    let lens = [3000usize, 45, 129];
    let first = inputs::paged_kv(16, &lens, 0, 2, 71);
    let second = inputs::paged_kv(16, &lens, 0, 2, 72);
    assert_eq!((first.num_pages, first.max_pages), (second.num_pages, second.max_pages));
    assert_ne!(first.block_table, second.block_table);
    let shorter = PagedKv::new(16, second.num_pages, second.block_table.clone(), vec![2900, 45, 17]);
    let base = AttentionProblem::new(lens.len(), 8, 1, 128).kv_heads(2).with_lse(true);
    let problems = [base.clone().paged_kv(first), base.clone().paged_kv(second), base.paged_kv(shorter)];
    let precision = Precision::F16_DEFAULT;
    let plans: Vec<quattn::Plan> = problems.iter().map(|p| s.plan(p, precision, Strategy::Auto).unwrap_or_else(|e| panic!("{e}"))).collect();
    let (q, k, v) = inputs::qkv(&problems[0], 73);
    let dt = precision.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let to_f16 = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let (dq, dk, dv) = (stream.clone_htod(&to_f16(&q)).unwrap(), stream.clone_htod(&to_f16(&k)).unwrap(), stream.clone_htod(&to_f16(&v)).unwrap());
    let order = [0usize, 0, 1, 2, 0];
    let mut outs = Vec::new();
    for &i in &order {
        let p = &problems[i];
        let mut d_o = stream.clone_htod(&vec![f16::NAN; p.o_len_elems()]).unwrap();
        let mut d_lse = stream.clone_htod(&vec![f32::NAN; p.lse_len_elems()]).unwrap();
        s.run_cuda(
            &plans[i],
            &stream,
            CudaTensor::new(&dq, &stream),
            CudaTensor::new(&dk, &stream),
            CudaTensor::new(&dv, &stream),
            CudaTensorMut::new(&mut d_o, &stream),
            Some(CudaTensorMut::new(&mut d_lse, &stream)),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", plans[i].kernel_name()));
        outs.push((d_o, d_lse));
    }
    let tol = Tolerance::for_precision(precision);
    let mut got = Vec::new();
    for (n, (&i, (d_o, d_lse))) in order.iter().zip(outs).enumerate() {
        let o: Vec<f32> = stream.clone_dtoh(&d_o).unwrap().iter().map(|x| x.to_f32()).collect();
        let lse = stream.clone_dtoh(&d_lse).unwrap();
        let r = attention_f64(&problems[i], &q, &k, &v).unwrap();
        let what = format!("call {n} ({})", plans[i].kernel_name());
        assert!(o.iter().all(|x| x.is_finite()), "{what}: a row left unwritten or non-finite");
        let m = ErrorMetrics::compare(&o, &r.o);
        assert!(tol.accepts(&m, r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()))), "{what}: {m:?}");
        let lm = compare_lse(&lse, &r.lse).unwrap_or_else(|| panic!("{what}: LSE infinities differ"));
        assert!(lm.max_abs <= tol.max_abs_rel, "{what}: LSE {lm:?}");
        got.push(o);
    }
    assert_eq!(got[0], got[1]);
    assert_eq!(got[0], got[4]);
    for n in [2, 3] {
        let m = ErrorMetrics::compare(&got[n], &got[0].iter().map(|&x| x as f64).collect::<Vec<_>>());
        assert!(m.rel_l2 > 0.1, "call {n} gives the first table's answer: {m:?}");
    }
}
