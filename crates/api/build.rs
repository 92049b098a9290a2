//! Generates the gRPC code from the .proto files with protox (a protobuf compiler in Rust, so
//! no `protoc` needs to be installed). Without the `service` feature only the messages are
//! generated (the fuzz targets decode them without building tonic).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/haul/meta/v1/meta.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let service = std::env::var_os("CARGO_FEATURE_SERVICE").is_some();
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(service)
        .build_server(service)
        .compile_fds(fds)?;
    Ok(())
}
