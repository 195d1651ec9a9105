//! `quattn`: the headless demo and benchmark binary. Its command line is a contract that scripts
//! and later issues build on: `run`, `bench`, `selftest`, `kernels`.

mod args;
mod bench;
mod check;
mod kernels;
mod peers;
mod reliability;
mod run;
mod selftest;
mod selftest_fp8;
mod soak;

use clap::Parser;

use args::{Cli, Command};

fn main() {
    // A closed pipe (`quattn bench | head`) ends the program quietly, as it does other Unix
    // tools, instead of making `println!` panic.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::main(&a),
        Command::Bench(a) => bench::main(&a),
        Command::Selftest(a) => selftest::main(&a),
        Command::Kernels(a) => kernels::main(&a),
        Command::Soak(a) => soak::main(&a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}
