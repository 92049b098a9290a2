//! The OCI image (`scripts/oci-image.sh`, issue 15 item 5): built from this build's `haul`
//! without a container engine, read back as any engine would (index, manifest, config by
//! their digests), unpacked with umoci, and its root file system runs `haul` as the image's
//! own user: the binary finds every library it needs inside the image, nothing from the host.

use sha2::{Digest, Sha256};
use std::path::Path;
use std::process::Command;

fn blob(layout: &Path, digest: &str) -> serde_json::Value {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let bytes = std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
    // Content-addressed: each blob is the digest it is named by.
    assert_eq!(hex::encode(Sha256::digest(&bytes)), hex, "blob {digest}");
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn the_oci_image_runs_haul_as_its_own_user() {
    if !testkit::is_root() {
        testkit::skip!("needs root (umoci unpack, chroot)");
    }
    if Command::new("umoci").arg("--version").output().is_err() {
        testkit::skip!("no umoci (Debian package umoci; scripts/test.sh installs it as root)");
    }
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("haul.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/oci-image.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_haul"))
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let layout = dir.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    let untar = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-xf")
        .arg(&archive)
        .status()
        .unwrap();
    assert!(untar.success());
    // index -> manifest -> config, each by its digest.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    let tag = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(tag, env!("CARGO_PKG_VERSION"));
    let manifest = blob(&layout, manifests[0]["digest"].as_str().unwrap());
    let config = blob(&layout, manifest["config"]["digest"].as_str().unwrap());
    let c = &config["config"];
    assert_eq!(c["Entrypoint"], serde_json::json!(["/usr/local/bin/haul"]));
    assert_eq!(c["User"], "haul");
    for port in ["5811/tcp", "5812/tcp", "5880/tcp"] {
        assert!(c["ExposedPorts"].get(port).is_some(), "{c}");
    }
    assert!(c["Volumes"].get("/var/lib/haul").is_some(), "{c}");
    // Unpacked, its root file system runs haul as uid 5811, with its libraries only.
    let bundle = dir.path().join("bundle");
    let unpack = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{tag}", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        unpack.status.success(),
        "{}",
        String::from_utf8_lossy(&unpack.stderr)
    );
    let rootfs = bundle.join("rootfs");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains("haul:x:5811:5811:"), "{passwd}");
    let run = |args: &[&str]| {
        Command::new("chroot")
            .arg("--userspec=5811:5811")
            .arg(&rootfs)
            .arg("/usr/local/bin/haul")
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap()
    };
    let version = run(&["--version"]);
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("haul {}", env!("CARGO_PKG_VERSION"))
    );
    let ca = run(&["ca", "init", "--dir", "/var/lib/haul/ca"]);
    assert!(ca.status.success(), "{ca:?}");
    use std::os::unix::fs::MetadataExt as _;
    let key = std::fs::metadata(rootfs.join("var/lib/haul/ca/ca.key")).unwrap();
    assert_eq!(key.uid(), 5811);
}
