//! The HIP backend's paths that need a runtime but not a GPU, through a stand-in libamdhip64
//! built here from C (there is no ROCm on CI): the runtime is found by `QUATTN_HIP_LIB` and
//! loaded with every entry point, devices are counted and their arch read from the properties
//! struct, an arch without kernels and an ordinal past the count are `DeviceUnavailable`, a
//! gfx942 device opens and plans onto the MFMA rows (and refuses the 4-bit modes), and a failing allocation is a typed
//! `Kernel` error; an FP8 run goes to the device prepass first (which needs hipRTC, absent).
//! The stand-in has two devices (gfx90a, gfx942) and fails every allocation;
//! nothing here runs a kernel.
//!
//! One test in this binary: the runtime is loaded once per process, after the variable is set.

use std::path::PathBuf;
use std::process::Command;

use quattn::error::TensorName;
use quattn::{AttentionProblem, Device, Dtype, Error, HipTensor, HipTensorMut, NativeKind, Precision, Session, Strategy};

const STUB: &str = r#"
#include <string.h>
#include <stddef.h>
static const char* ARCH[2] = {"gfx90a:sramecc+:xnack-", "gfx942:sramecc+:xnack-"};
int hipInit(unsigned f) { (void)f; return 0; }
int hipGetDeviceCount(int* n) { *n = 2; return 0; }
int hipSetDevice(int d) { return d < 2 ? 0 : 101; }
int hipDeviceGetName(char* s, int len, int d) { strncpy(s, d ? "Stand-in MI300X" : "Stand-in MI210", len); return 0; }
int hipGetDevicePropertiesR0600(void* p, int d) {
    memset(p, 0, 1600);
    strcpy((char*)p, "Stand-in");
    strcpy((char*)p + 1160, ARCH[d]);
    return 0;
}
int hipMalloc(void** p, size_t n) { (void)p; (void)n; return 2; }
int hipFree(void* p) { (void)p; return 0; }
int hipMemcpyHtoD(void* d, const void* s, size_t n) { (void)d; (void)s; (void)n; return 1; }
int hipMemcpyDtoH(void* d, void* s, size_t n) { (void)d; (void)s; (void)n; return 1; }
int hipMemset(void* d, int v, size_t n) { (void)d; (void)v; (void)n; return 1; }
int hipDeviceSynchronize(void) { return 0; }
int hipModuleLoadData(void** m, const void* i) { (void)m; (void)i; return 1; }
int hipModuleUnload(void* m) { (void)m; return 0; }
int hipModuleGetFunction(void** f, void* m, const char* n) { (void)f; (void)m; (void)n; return 1; }
int hipModuleLaunchKernel(void* f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned s,
                          void* st, void** p, void** x) { return 1; }
int hipEventCreate(void** e) { (void)e; return 1; }
int hipEventRecord(void* e, void* s) { (void)e; (void)s; return 1; }
int hipEventSynchronize(void* e) { (void)e; return 1; }
int hipEventElapsedTime(float* ms, void* a, void* b) { (void)ms; (void)a; (void)b; return 1; }
int hipEventDestroy(void* e) { (void)e; return 0; }
const char* hipGetErrorString(int e) { return e == 2 ? "hipErrorOutOfMemory" : "stand-in error"; }
"#;

fn build_stub() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("quattn-hip-stub-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("stub.c");
    std::fs::write(&src, STUB).map_err(|e| e.to_string())?;
    let lib = dir.join("libamdhip64.so");
    let out = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&src).output().map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(lib)
}

#[test]
fn hip_backend_paths_with_a_stand_in_runtime() {
    let lib = match build_stub() {
        Ok(l) => l,
        Err(e) => {
            let ci = std::env::var("CI").map(|v| !v.is_empty() && v != "false").unwrap_or(false);
            assert!(!ci, "no C compiler for the stand-in runtime: {e}");
            eprintln!("skipped: {e}");
            return;
        }
    };
    std::env::set_var("QUATTN_HIP_LIB", &lib);
    // No libhiprtc anywhere: the name the runtime tries first is replaced by a missing file.
    std::env::set_var("QUATTN_HIPRTC_LIB", lib.with_file_name("libhiprtc-absent.so"));

    // Device 0 is a gfx90a: no kernels for it.
    match Session::new(Device::Hip(0)) {
        Err(Error::DeviceUnavailable { reason, .. }) => assert!(reason.contains("gfx90a"), "{reason}"),
        other => panic!("gfx90a: expected DeviceUnavailable, got {:?}", other.err()),
    }
    match Session::new(Device::Hip(2)) {
        Err(Error::DeviceUnavailable { reason, .. }) => assert!(reason.contains("2 HIP device(s)"), "{reason}"),
        other => panic!("ordinal 2: expected DeviceUnavailable, got {:?}", other.err()),
    }

    // Device 1 is a gfx942: it opens, and plans go to the MFMA rows.
    let s = Session::new(Device::Hip(1)).expect("the stand-in gfx942 opens");
    let info = s.info();
    assert_eq!(info.kind, "hip");
    assert!(info.adapter.contains("gfx942"), "{}", info.adapter);
    let p = AttentionProblem::new(1, 4, 100, 128).kv_heads(2).causal(true).with_lse(true);
    let plan = s.plan(&p, Precision::BF16_DEFAULT, Strategy::Auto).expect("bf16 plans on gfx942");
    assert_eq!(plan.kernel_name(), "fwd_mfma_bf16_d128_gfx942");
    assert_eq!(plan.family(), quattn::Family::Native(NativeKind::HipMfma));
    let fp8 = Precision::Fp8 { format: quattn::Fp8Format::E4M3, descale: quattn::DescaleGranularity::PerHead, p: quattn::PvFormat::Fp8 };
    let plan8 = s.plan(&p, fp8, Strategy::Auto).expect("FP8 plans on gfx942");
    assert_eq!(plan8.kernel_name(), "fwd_mfma_fp8_pfp8_of16_d128_gfx942");
    // What the rows refuse: another head dim, f32, e5m2, per-block descales.
    assert!(matches!(s.plan(&AttentionProblem::new(1, 1, 8, 96), Precision::F16_DEFAULT, Strategy::Auto), Err(Error::UnsupportedHeadDim { .. })));
    assert!(s.plan(&p, Precision::F32, Strategy::Auto).is_err());
    let e5m2 = Precision::Fp8 { format: quattn::Fp8Format::E5M2, descale: quattn::DescaleGranularity::PerHead, p: quattn::PvFormat::F16 };
    assert!(s.plan(&p, e5m2, Strategy::Auto).is_err());
    let per_block = Precision::Fp8 { format: quattn::Fp8Format::E4M3, descale: quattn::DescaleGranularity::PerBlock, p: quattn::PvFormat::F16 };
    assert!(s.plan(&p, per_block, Strategy::Auto).is_err());
    assert!(matches!(s.plan(&p, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Hmma)), Err(Error::UnsupportedStrategy { .. })));
    // No 4-bit kernel: NVFP4 and MXFP4 are refused naming that.
    for prec in [Precision::NVFP4_DEFAULT, Precision::Mxfp4 { smooth_k: false }] {
        match s.plan(&p, prec, Strategy::Auto) {
            Err(Error::UnsupportedPrecision { reason, .. }) => assert!(reason.contains("no HIP 4-bit kernel"), "{prec}: {reason}"),
            other => panic!("{prec}: {:?}", other.map(|p| p.kernel_name())),
        }
    }

    // The stand-in fails every allocation: a typed error naming the kernel and the HIP call.
    let x = vec![0.5f32; p.q_len_elems().max(p.k_len_elems())];
    match s.run(&plan, &x[..p.q_len_elems()], &x[..p.k_len_elems()], &x[..p.v_len_elems()]) {
        Err(Error::Kernel { kernel, reason }) => {
            assert_eq!(kernel, "fwd_mfma_bf16_d128_gfx942");
            assert!(reason.contains("hipMalloc") && reason.contains("hipErrorOutOfMemory"), "{reason}");
        }
        other => panic!("expected a Kernel error, got {:?}", other.map(|o| o.kernel)),
    }
    // An FP8 run quantizes on the device: it loads the prepass (compiled by hipRTC, absent
    // here) before allocating anything, so the error names the prepass, not hipMalloc.
    match s.run(&plan8, &x[..p.q_len_elems()], &x[..p.k_len_elems()], &x[..p.v_len_elems()]) {
        Err(Error::Kernel { kernel, reason }) => {
            assert_eq!(kernel, "fp8_prepass_amax_f16");
            assert!(reason.contains("hiprtc") && !reason.contains("hipMalloc"), "{reason}");
        }
        other => panic!("expected a Kernel error, got {:?}", other.map(|o| o.kernel)),
    }

    run_hip_checks(&s, &p, &plan, &plan8);
}

/// `Session::run_hip` on caller-owned device addresses: every mistake the host can see is a
/// typed error before anything reaches the runtime, and well-formed calls fail on the missing
/// hipRTC with the kernel they needed.
fn run_hip_checks(s: &Session, p: &AttentionProblem, plan: &quattn::Plan, plan8: &quattn::Plan) {
    // SAFETY: the addresses are never dereferenced: the stand-in runtime launches nothing and
    // every call below fails before a launch.
    let t = |addr: u64, len: usize, dtype: Dtype| unsafe { HipTensor::from_raw(addr, len, dtype) };
    let m = |addr: u64, len: usize, dtype: Dtype| unsafe { HipTensorMut::from_raw(addr, len, dtype) };
    let (nq, nk, nv, no, nl) = (p.q_len_elems(), p.k_len_elems(), p.v_len_elems(), p.o_len_elems(), p.lse_len_elems());
    let bf = Dtype::Bf16;
    let call = |q: HipTensor<'static>, k: HipTensor<'static>, lse: Option<HipTensorMut<'static>>| {
        s.run_hip(plan, q, k, t(0x30000, nv, bf), m(0x40000, no, bf), lse)
    };
    match call(t(0x10000, nq, Dtype::F16), t(0x20000, nk, bf), Some(m(0x50000, nl, Dtype::F32))) {
        Err(Error::Dtype { tensor: TensorName::Q, expected: Dtype::Bf16, got: Dtype::F16 }) => {}
        other => panic!("f16 Q for a bf16 plan: {other:?}"),
    }
    match call(t(0x10000, nq, bf), t(0x20000, nk - 1, bf), Some(m(0x50000, nl, Dtype::F32))) {
        Err(Error::BufferLength { tensor: TensorName::K, expected, got }) => assert_eq!((expected, got), (nk, nk - 1)),
        other => panic!("short K: {other:?}"),
    }
    match call(t(0x10000, nq, bf), t(0x20000, nk, bf), None) {
        Err(Error::BufferLength { tensor: TensorName::Lse, expected, got: 0 }) => assert_eq!(expected, nl),
        other => panic!("LSE asked for and not given: {other:?}"),
    }
    match call(t(0x10000, nq, bf), t(0x20000, nk, bf), Some(m(0x50000, nl, bf))) {
        Err(Error::Dtype { tensor: TensorName::Lse, expected: Dtype::F32, .. }) => {}
        other => panic!("bf16 LSE: {other:?}"),
    }
    match call(t(0x10008, nq, bf), t(0x20000, nk, bf), Some(m(0x50000, nl, Dtype::F32))) {
        Err(Error::Kernel { reason, .. }) => assert!(reason.contains("16-byte"), "{reason}"),
        other => panic!("misaligned Q: {other:?}"),
    }
    // Well-formed: the kernel is compiled by hipRTC, absent here.
    match call(t(0x10000, nq, bf), t(0x20000, nk, bf), Some(m(0x50000, nl, Dtype::F32))) {
        Err(Error::Kernel { kernel, reason }) => {
            assert_eq!(kernel, "fwd_mfma_bf16_d128");
            assert!(reason.contains("hiprtc"), "{reason}");
        }
        other => panic!("expected the missing hipRTC, got {other:?}"),
    }
    // FP8 takes f16 Q, K, V and runs the prepass first.
    let f = Dtype::F16;
    let fp8 = |q: Dtype| s.run_hip(plan8, t(0x10000, nq, q), t(0x20000, nk, f), t(0x30000, nv, f), m(0x40000, no, f), Some(m(0x50000, nl, Dtype::F32)));
    match fp8(bf) {
        Err(Error::Dtype { tensor: TensorName::Q, expected: Dtype::F16, got: Dtype::Bf16 }) => {}
        other => panic!("bf16 Q for an FP8 plan: {other:?}"),
    }
    match fp8(f) {
        Err(Error::Kernel { kernel, reason }) => {
            assert_eq!(kernel, "fp8_prepass_amax_f16");
            assert!(reason.contains("hiprtc"), "{reason}");
        }
        other => panic!("expected the prepass to need hipRTC, got {other:?}"),
    }
    // Another device's session: HIP memory is refused with a typed error.
    let cpu = Session::new(Device::Cpu).expect("the CPU backend");
    let cplan = cpu.plan(p, Precision::F32, Strategy::Auto).expect("f32 plans on the CPU");
    let d = Dtype::F32;
    match cpu.run_hip(&cplan, t(0x10000, nq, d), t(0x20000, nk, d), t(0x30000, nv, d), m(0x40000, no, d), Some(m(0x50000, nl, d))) {
        Err(Error::WrongDevice { got, .. }) => assert!(got.contains("HIP"), "{got}"),
        other => panic!("HIP memory on a CPU session: {other:?}"),
    }
}
