//! Issue #5's accuracy requirement on the CPU emulation of `Int8Qk` (the kernels agree with the
//! emulation to fp16 rounding, tested in `portable.rs`, which also runs this check on the
//! portable kernel): normal inputs with +8σ on a few K channels, hd 64 and 128, with smoothing
//! cos-sim ≥ 0.9995 and rel-L1 ≤ 0.02 against the f64 reference; without smoothing printed
//! beside it.

mod common;

use common::{assert_int8_accuracy, outlier_channel_inputs};
use quattn::emulation::{emulate, Blocking};
use quattn::AttentionProblem;

#[test]
fn int8_accuracy_with_an_outlier_channel_in_k() {
    for d in [64, 128] {
        let p = AttentionProblem::new(1, 4, 256, d).kv_heads(2);
        let (q, k, v) = outlier_channel_inputs(&p, 51 + d as u64);
        assert_int8_accuracy("emulation", &p, &q, &k, &v, |prec| emulate(&p, prec, &Blocking::default(), &q, &k, &v).unwrap().o);
    }
}
