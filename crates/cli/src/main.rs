//! `haul`: the one longhaul binary. Thin over the library crates: parses the command line,
//! sets up logging and signals, runs the command, and maps errors to documented exit codes.

/// Prints a line on stdout. A closed stdout (`haul ls | head`) ends the program quietly with
/// status 141, as for tools killed by SIGPIPE, instead of a panic.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        if writeln!(o, $($t)*).is_err() {
            std::process::exit(141);
        }
    }};
}

mod args;
mod config;
mod cp;
mod creds;
mod demo;
mod docs_cmd;
mod doctor_cmd;
mod grid_cmd;
mod job_cmd;
mod jsondoc;
mod lifecycle_cmd;
mod meta_cmd;
mod mount_cmd;
mod node_cmd;
mod perf_cmd;
mod pki;
mod progress;
mod repl_cmd;
mod run_cmd;
mod serve;
mod trace_cmd;
mod transfers_cmd;

use std::process::ExitCode;

fn main() -> ExitCode {
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let conf = match config::Config::load(config::explicit_path(&raw)) {
        Ok((c, _)) => c,
        Err(e) => {
            eprintln!("haul: error: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = conf
        .apply(<args::Cli as clap::CommandFactory>::command())
        .try_get_matches_from(raw);
    // The subcommand's full name ("meta serve", "cert issue"): every log line of this process
    // is inside the span it names.
    let command_name = matches.as_ref().map(command_path).unwrap_or_default();
    let json = matches.as_ref().is_ok_and(wants_json);
    let parsed = matches.and_then(|m| <args::Cli as clap::FromArgMatches>::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors exit 2.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging(&cli);
    // netlab waits for its stop signals with sigtimedwait after blocking them, which works only
    // while it is the process's only thread: run it before the async runtime's workers exist
    // (under them, SIGTERM killed `haul netlab up` without removing its lab's global settings).
    if let args::Command::Netlab { args } = &cli.command {
        let argv = std::iter::once("haul netlab".to_string())
            .chain(args.iter().cloned())
            .collect();
        return ExitCode::from(netlab::cli::main(argv).clamp(0, 255) as u8);
    }
    // Generated from the command definition; no runtime, no logging needed.
    let generated = match &cli.command {
        args::Command::Completions(a) => Some(docs_cmd::completions(a)),
        args::Command::Man(a) => Some(docs_cmd::man(a)),
        _ => None,
    };
    if let Some(r) = generated {
        return match r {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("haul: error: {}", grid_cmd::one_line(&e.to_string()));
                ExitCode::from(e.exit_code() as u8)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("haul: error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let span = tracing::info_span!("command", name = %command_name);
    let result = runtime.block_on(tracing::Instrument::instrument(run(cli), span));
    // Blocking threads (file readers) must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // One line, whatever names the message quotes.
            let text = e.to_string();
            let line = grid_cmd::one_line(&text);
            eprintln!("haul: error: {line}");
            if json {
                // What failed, for programs: {"kind": ..., "exit_code": ..., "message": ...}.
                let report = transfer::error::ErrorReport {
                    message: line.into_owned(),
                    ..(&e).into()
                };
                println!(
                    "{}",
                    jsondoc::versioned(serde_json::to_value(&report).unwrap_or_default())
                );
            }
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// Whether the command asked for `--json` (the innermost subcommand's flag).
fn wants_json(m: &clap::ArgMatches) -> bool {
    let mut cur = m;
    while let Some((_, sub)) = cur.subcommand() {
        cur = sub;
    }
    matches!(cur.try_get_one::<bool>("json"), Ok(Some(true)))
}

/// "cp", "meta serve": the subcommands named on the command line.
fn command_path(m: &clap::ArgMatches) -> String {
    let mut names = Vec::new();
    let mut cur = m;
    while let Some((name, sub)) = cur.subcommand() {
        names.push(name);
        cur = sub;
    }
    names.join(" ")
}

fn init_logging(cli: &args::Cli) {
    let default = match (&cli.command, cli.verbose) {
        (_, v) if v >= 2 => "debug",
        (_, 1) => "info",
        (args::Command::Serve(_), _)
        | (args::Command::Meta(_), _)
        | (args::Command::Node(args::NodeCommand::Serve(_)), _) => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("HAUL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match cli.log_format {
        // One JSON object per line, with the span's fields (peer, user, session id).
        args::LogFormatArg::Json => fmt.json().with_current_span(true).try_init(),
        // Colour only on a terminal: a daemon's log file or journal gets plain text.
        args::LogFormatArg::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}

async fn run(cli: args::Cli) -> Result<u8, transfer::TransferError> {
    match cli.command {
        args::Command::Cp(a) => cp::run(a).await,
        args::Command::Trace(args::TraceCommand::Summary(a)) => trace_cmd::summary(a),
        args::Command::Doctor(a) => doctor_cmd::run(a).await,
        args::Command::Perf(a) => perf_cmd::run(a).await,
        args::Command::Trace(args::TraceCommand::Plot(a)) => trace_cmd::plot(a),
        args::Command::Serve(a) => serve::run(a).await.map(|()| 0),
        args::Command::Demo(a) => demo::run(a).await,
        args::Command::Meta(args::MetaCommand::Serve(a)) => meta_cmd::run(a).await.map(|()| 0),
        args::Command::Node(args::NodeCommand::Serve(a)) => node_cmd::run(*a).await.map(|()| 0),
        args::Command::Node(args::NodeCommand::Drain(a)) => lifecycle_cmd::drain(a).await,
        args::Command::Node(args::NodeCommand::Remove(a)) => lifecycle_cmd::remove(a).await,
        args::Command::Ls(a) => grid_cmd::ls(a).await,
        args::Command::Stat(a) => grid_cmd::stat(a).await,
        args::Command::Mkdir(a) => grid_cmd::mkdir(a).await,
        args::Command::Rm(a) => grid_cmd::rm(a).await,
        args::Command::Mv(a) => grid_cmd::mv(a).await,
        args::Command::Chmod(a) => grid_cmd::chmod(a).await,
        args::Command::Chown(a) => grid_cmd::chown(a).await,
        args::Command::Xattr(c) => grid_cmd::xattr(c).await,
        args::Command::Where(a) => grid_cmd::where_(a).await,
        args::Command::Df(a) => grid_cmd::df(a).await,
        args::Command::Mount(a) => mount_cmd::run(a).await,
        args::Command::Nodes(a) => grid_cmd::nodes(a).await,
        args::Command::Whoami(a) => grid_cmd::whoami(a).await,
        args::Command::Dashboard(a) => grid_cmd::dashboard(a).await,
        args::Command::Replicate(a) => repl_cmd::replicate(a).await,
        args::Command::Policy(c) => repl_cmd::policy(c).await,
        args::Command::Verify(a) => repl_cmd::verify(a).await,
        args::Command::Status(a) => repl_cmd::status(a).await,
        args::Command::Transfers(a) => transfers_cmd::transfers(a).await,
        args::Command::Submit(a) => job_cmd::submit(a).await,
        args::Command::Jobs(a) => job_cmd::jobs(a).await,
        args::Command::Job(c) => job_cmd::job(c).await,
        args::Command::Run(a) => run_cmd::run(a).await,
        args::Command::Ca(args::CaCommand::Init(a)) => pki::ca_init(a).map(|()| 0),
        args::Command::Cert(args::CertCommand::Issue(a)) => pki::cert_issue(a).map(|()| 0),
        args::Command::Cert(args::CertCommand::Delegate(a)) => pki::cert_delegate(a).map(|()| 0),
        // Dispatched in `main` before the runtime starts.
        args::Command::Netlab { .. } | args::Command::Completions(_) | args::Command::Man(_) => {
            Ok(1)
        }
    }
}
