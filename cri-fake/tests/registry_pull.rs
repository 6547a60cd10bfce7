//! cri-fake pulls real images from a private registry (a real `docker-registry` behind basic auth), over
//! its CRI socket, into containers/storage's layout. Skipped, with a message, when the registry binary is
//! not installed (`.ci/run` installs it).

use std::sync::Arc;

use cri_fake::layout::{ImageBuilder, push};
use cri_fake::pull::Registries;
use cri_fake::registry::LocalRegistry;
use cri_fake::{FakeRuntime, serve};
use inlet_proto::runtime::v1::{self as cri, image_service_client::ImageServiceClient};
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use tonic::Code;

#[tokio::test]
async fn pulls_private_images_with_credentials_only() {
    if !LocalRegistry::available() {
        eprintln!("SKIPPED: {} is not installed", cri_fake::registry::BINARY);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry =
        LocalRegistry::start(&dir.path().join("registry"), Some(("alice", "s3cret"))).unwrap();
    let image = ImageBuilder::new()
        .file("data/hello.txt", "hello from the registry\n")
        .layer()
        .file("data/two.txt", "2\n")
        .build()
        .unwrap();
    let reference: Reference = format!("{}/test/data:v1", registry.address)
        .parse()
        .unwrap();
    let insecure = vec![registry.address.clone()];
    push(
        &image,
        &reference,
        &RegistryAuth::Basic("alice".into(), "s3cret".into()),
        &insecure,
    )
    .await
    .unwrap();

    let registries = Registries {
        secure: vec![],
        insecure,
    };
    let runtime = Arc::new(
        FakeRuntime::with_registries(dir.path().join("root"), Default::default(), registries)
            .unwrap(),
    );
    let socket = dir.path().join("cri.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (socket, runtime) = (socket.clone(), Arc::clone(&runtime));
        tokio::spawn(async move {
            serve(&socket, runtime, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    let channel = loop {
        if let Ok(c) = inlet_proto::uds::connect(&socket).await {
            break c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let mut images = ImageServiceClient::new(channel);
    let pull = |auth: Option<cri::AuthConfig>| cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: reference.whole(),
            ..Default::default()
        }),
        auth,
        sandbox_config: None,
    };

    let refused = images.pull_image(pull(None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unknown);
    assert!(
        refused.message().contains("401 Unauthorized"),
        "{}",
        refused.message()
    );
    let wrong = cri::AuthConfig {
        username: "alice".into(),
        password: "wrong-password".into(),
        ..Default::default()
    };
    let refused = images.pull_image(pull(Some(wrong))).await.unwrap_err();
    assert!(
        !refused.message().contains("wrong-password"),
        "credentials leaked: {}",
        refused.message()
    );

    let right = cri::AuthConfig {
        username: "alice".into(),
        password: "s3cret".into(),
        ..Default::default()
    };
    let image_ref = images
        .pull_image(pull(Some(right.clone())))
        .await
        .unwrap()
        .into_inner()
        .image_ref;
    let status = images
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: reference.whole(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .image
        .unwrap();
    // As CRI-O: PullImage answers with the repository digest; the id comes from ImageStatus.
    assert_eq!(image_ref, status.repo_digests[0]);
    let id = status.id.clone();
    assert_eq!(status.repo_tags, [reference.whole()]);
    assert!(
        status.repo_digests[0].ends_with(&image.digest),
        "{:?}",
        status.repo_digests
    );

    // The content is in containers/storage's layout: the top layer holds the second file.
    let storage = runtime.images().storage();
    let entry = storage
        .images()
        .unwrap()
        .into_iter()
        .find(|i| i.id == id)
        .unwrap();
    let top = dir
        .path()
        .join("root/overlay")
        .join(&entry.layer)
        .join("diff/data/two.txt");
    assert_eq!(std::fs::read_to_string(top).unwrap(), "2\n");

    let missing = cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: format!("{}/test/absent:v1", registry.address),
            ..Default::default()
        }),
        ..pull(Some(right))
    };
    let absent = images.pull_image(missing).await.unwrap_err();
    assert_eq!(absent.code(), Code::NotFound, "{}", absent.message());
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
