//! `haul completions SHELL` and `haul man`: shell completion scripts (clap_complete) and
//! manual pages (clap_mangen), both generated from the same command definition as `--help`,
//! so that they cannot drift from it.

use crate::args::{Cli, CompletionsArgs, ManArgs};
use clap::CommandFactory;
use transfer::TransferError;

/// Prints the completion script for `a.shell` on stdout.
pub fn completions(a: &CompletionsArgs) -> Result<u8, TransferError> {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "haul", &mut std::io::stdout());
    Ok(0)
}

/// Writes haul.1 to stdout, or every page into `a.dir`.
pub fn man(a: &ManArgs) -> Result<u8, TransferError> {
    let cmd = Cli::command();
    let io = |what: String| move |e: std::io::Error| TransferError::local(format!("{what}: {e}"));
    match &a.dir {
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd)
                .render(&mut out)
                .map_err(io("writing the manual page".into()))?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(io(format!("{}", dir.display())))?;
            clap_mangen::generate_to(cmd, dir).map_err(io(format!(
                "writing the manual pages into {}",
                dir.display()
            )))?;
        }
    }
    Ok(0)
}
