//! The scope text of a delegation a client's certificate carries: any bytes parse or are
//! refused without panicking, a parsed scope renders back to itself, and what it permits never
//! includes a path that climbs out (`..`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use wire::delegation::{Access, Scope};

fuzz_target!(|bytes: &[u8]| {
    let Ok(s) = Scope::parse(bytes) else { return };
    assert_eq!(Scope::parse(s.render().as_bytes()).as_ref(), Ok(&s));
    let hosts: Vec<String> = s.grants.iter().map(|g| g.host.clone()).collect();
    for g in &s.grants {
        assert!(s.permits(&hosts, g.access, &g.path));
        assert!(!s.permits(&hosts, Access::Read, &format!("{}/../x", g.path)));
    }
});
