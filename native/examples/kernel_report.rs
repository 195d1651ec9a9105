//! Prints the compile report (every HMMA variant x target), like `quattn kernels`; no GPU needed.
//! `cargo run -p quattn-native --example kernel_report [-- --json]`
fn main() {
    let reports = quattn_native::compile_report(quattn_native::KernelCache::global(), None);
    if std::env::args().any(|a| a == "--json") {
        println!("{}", serde_json::to_string_pretty(&reports).unwrap_or_default());
    } else {
        for r in &reports {
            println!("{}", r.summary());
        }
    }
    let failed = reports.iter().filter(|r| !r.ok()).count();
    println!("{} of {} ok", reports.len() - failed, reports.len());
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
