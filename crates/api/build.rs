//! Generates the gRPC code from the .proto files with protox (a protobuf compiler in Rust, so
//! no `protoc` needs to be installed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/haul/meta/v1/meta.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
