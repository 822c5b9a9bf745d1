//! gRPC server reflection on the gRPC listener: the checked-in descriptors are envoy-types'
//! own, and a real reflection client (tonic's, v1 and v1alpha) lists the services and
//! resolves `RateLimitService` with every file it imports, as `grpcurl describe` does.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use prost::Message;
use prost_reflect::{DescriptorPool, FileDescriptor};
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

/// The files the Envoy services are declared in; the set holds them and what they import.
const ROOTS: [&str; 2] = [
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
];

/// The Envoy services' `FileDescriptorSet`, cut out of envoy-types' `types.bin`: each root
/// and its imports, every file after the files it imports.
fn envoy_services_set() -> Vec<u8> {
    fn add(file: &FileDescriptor, pool: &mut DescriptorPool, done: &mut BTreeSet<String>) {
        if !done.insert(file.name().to_owned()) {
            return;
        }
        for dep in file.dependencies() {
            add(&dep, pool, done);
        }
        pool.add_file_descriptor_proto(file.file_descriptor_proto().clone())
            .unwrap();
    }
    let all = super::envoy_config::envoy_descriptors();
    let mut pool = DescriptorPool::new();
    let mut done = BTreeSet::new();
    for root in ROOTS {
        let file = all
            .get_file_by_name(root)
            .unwrap_or_else(|| panic!("{root}"));
        add(&file, &mut pool, &mut done);
    }
    pool.encode_to_vec()
}

/// The checked-in set is the one cut out of the envoy-types cargo resolved;
/// `SLUICE_BLESS=1` rewrites it (after an envoy-types upgrade).
#[test]
fn descriptors_are_the_ones_envoy_types_ships() {
    let built = envoy_services_set();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("descriptors/envoy-services.bin");
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&file, &built).unwrap();
    }
    let checked_in = std::fs::read(&file).unwrap();
    assert!(
        checked_in == built,
        "{} is not the set cut out of envoy-types ({} bytes, built {}); rewrite it with \
         SLUICE_BLESS=1 cargo nextest run -p sluice-server --test envoy reflection",
        file.display(),
        checked_in.len(),
        built.len()
    );
    assert!(
        sluice_server::reflection::ENVOY_DESCRIPTORS == &built[..],
        "the server was built with other descriptors than {}: rebuild it",
        file.display()
    );
    // Decodes whole: every import is in it.
    let pool = DescriptorPool::decode(&built[..]).unwrap();
    assert!(
        pool.get_service_by_name("envoy.service.ratelimit.v3.RateLimitService")
            .is_some()
    );
}

/// One request and its answer over a v1 reflection stream.
async fn ask(
    client: &mut ServerReflectionClient<tonic::transport::Channel>,
    request: MessageRequest,
) -> MessageResponse {
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let answer: ServerReflectionResponse = answers.message().await.unwrap().unwrap();
    answer.message_response.unwrap()
}

fn files(answer: MessageResponse) -> Vec<prost_types::FileDescriptorProto> {
    match answer {
        MessageResponse::FileDescriptorResponse(r) => r
            .file_descriptor_proto
            .iter()
            .map(|b| prost_types::FileDescriptorProto::decode(&b[..]).unwrap())
            .collect(),
        other => panic!("not files: {other:?}"),
    }
}

#[tokio::test]
async fn reflection_lists_the_services_and_resolves_rate_limit_service() {
    let server = super::support::TestServer::start("policies: {}\n", &[]).await;
    let mut client = ServerReflectionClient::new(server.channel().await);

    let listed = match ask(&mut client, MessageRequest::ListServices(String::new())).await {
        MessageResponse::ListServicesResponse(r) => r
            .service
            .into_iter()
            .map(|s| s.name)
            .collect::<BTreeSet<_>>(),
        other => panic!("{other:?}"),
    };
    let expected: BTreeSet<String> = [
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(listed, expected);

    // `describe`: the file of the symbol, then every file it imports, by name, until the
    // descriptors are whole; then they decode into a pool that knows the method's types.
    let service = "envoy.service.ratelimit.v3.RateLimitService";
    let mut got: BTreeMap<String, prost_types::FileDescriptorProto> = BTreeMap::new();
    let mut wanted: Vec<String> = Vec::new();
    for f in files(
        ask(
            &mut client,
            MessageRequest::FileContainingSymbol(service.into()),
        )
        .await,
    ) {
        wanted.extend(f.dependency.iter().cloned());
        got.insert(f.name().to_owned(), f);
    }
    assert!(
        got.contains_key("envoy/service/ratelimit/v3/rls.proto"),
        "{:?}",
        got.keys()
    );
    while let Some(name) = wanted.pop() {
        if got.contains_key(&name) {
            continue;
        }
        for f in files(ask(&mut client, MessageRequest::FileByFilename(name.clone())).await) {
            wanted.extend(f.dependency.iter().cloned());
            got.insert(f.name().to_owned(), f);
        }
    }
    let set = prost_types::FileDescriptorSet {
        file: got.into_values().collect(),
    };
    let pool = DescriptorPool::from_file_descriptor_set(set).unwrap();
    let rls = pool.get_service_by_name(service).unwrap();
    let method = rls
        .methods()
        .find(|m| m.name() == "ShouldRateLimit")
        .unwrap();
    assert_eq!(
        method.input().full_name(),
        "envoy.service.ratelimit.v3.RateLimitRequest"
    );
    assert!(
        method.input().get_field_by_name("descriptors").is_some(),
        "{:?}",
        method.input()
    );

    // An unknown symbol is an error (tonic-reflection ends the stream with NOT_FOUND), not
    // an empty answer.
    let unknown = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol("no.Such".into())),
    };
    let status = client
        .server_reflection_info(tokio_stream::iter([unknown]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");

    // The older protocol lists the same services.
    let mut alpha =
        tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient::new(
            server.channel().await,
        );
    use tonic_reflection::pb::v1alpha as a;
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([a::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(a::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        }]))
        .await
        .unwrap()
        .into_inner();
    match answers
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap()
    {
        a::server_reflection_response::MessageResponse::ListServicesResponse(r) => {
            let names: BTreeSet<String> = r.service.into_iter().map(|s| s.name).collect();
            assert_eq!(names, expected);
        }
        other => panic!("{other:?}"),
    }
    server.stop().await;
}
