//! One harness for everything that runs longhaul as processes: the integration tests of
//! `haul` (`crates/cli/tests`), the grid benchmarks (`haul-gridbench`) and the netlab
//! benchmarks (`haul-replbench`, `haul-faultbench`). It owns what they all need the same way:
//!
//! - [`process`]: child processes killed when dropped, servers that print their address, and
//!   commands bounded in time;
//! - [`pki`]: a CA, host certificates for the metadata server and the storage nodes, user
//!   certificates, the mapfile, groups and the node enrolment file — made with `haul ca init`
//!   and `haul cert issue`, as an operator would;
//! - [`daemons`]: the command lines of `haul meta serve` and `haul node serve` over such a PKI;
//! - [`http`]: a plain HTTP GET, for the dashboard.
//!
//! Where processes run (loopback, or a netlab host's namespace) is the caller's choice: every
//! function takes the `Command` to start `haul` with. `haul demo` runs its grid inside one
//! process and needs none of this.

pub mod daemons;
pub mod http;
pub mod pki;
pub mod process;
