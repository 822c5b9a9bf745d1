//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`) on the gRPC listener, so that
//! `grpcurl -plaintext host:port list` and `describe` work without proto files.
//!
//! The Envoy services' descriptors are a checked-in `FileDescriptorSet`,
//! `descriptors/envoy-services.bin`: the files of `rls.proto` and `rlqs.proto` and everything
//! they import, cut out of the complete set envoy-types ships (`src/generated/types.bin`, 3 MB,
//! which it does not export). No protoc is involved. The envoy tests rebuild it from the
//! envoy-types that cargo resolved and fail when it differs (`reflection::descriptors_*`);
//! after an envoy-types upgrade,
//! `SLUICE_BLESS=1 cargo nextest run -p sluice-server --test envoy reflection` rewrites it.
//! The health service's descriptors are tonic-health's own.

use tonic_reflection::server::{Builder, Error, v1, v1alpha};

/// The Envoy services' files (see the module's text).
pub const ENVOY_DESCRIPTORS: &[u8] = include_bytes!("../descriptors/envoy-services.bin");

/// The services the reflection lists: the gRPC listener's own.
pub const SERVICES: [&str; 5] = [
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

fn builder() -> Builder<'static> {
    SERVICES.iter().fold(
        Builder::configure()
            .register_encoded_file_descriptor_set(ENVOY_DESCRIPTORS)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            ),
        |b, name| b.with_service_name(*name),
    )
}

/// The v1 reflection service.
pub(crate) fn v1() -> Result<v1::ServerReflectionServer<impl v1::ServerReflection>, Error> {
    builder().build_v1()
}

/// The v1alpha reflection service (grpcurl before 1.8.8 and other older clients).
pub(crate) fn v1alpha()
-> Result<v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>, Error> {
    builder().build_v1alpha()
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_versions_build_from_the_checked_in_descriptors() {
        super::v1().unwrap();
        super::v1alpha().unwrap();
    }
}
