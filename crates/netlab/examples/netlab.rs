//! Stand-alone entry point for trying the CLI before it is mounted as `haul netlab`:
//! `cargo run -p netlab --example netlab -- up --rtt 20ms`.

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "netlab".into();
    }
    std::process::exit(netlab::cli::main(args));
}
