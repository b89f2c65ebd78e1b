//! Generates the fjord.v1 messages and tonic services, with the vendored protoc so that
//! building needs no system package, plus a file descriptor set for gRPC reflection.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // tonic-prost-build finds protoc through $PROTOC.
    std::env::set_var("PROTOC", protoc);
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("fjord_v1_descriptor.bin"))
        .bytes(".fjord.v1")
        // Bounds what one PublishRequest costs to decode (src/codec.rs).
        .codec_path("crate::codec::BoundedCodec")
        .compile_protos(&["fjord/v1/events.proto"], &["."])?;
    println!("cargo:rerun-if-changed=fjord/v1/events.proto");
    Ok(())
}
