//! cri-fake through a standard CRI client (the generated `runtime.v1` clients) over a real unix socket.

use std::sync::Arc;
use std::time::Duration;

use cri_fake::FakeRuntime;
use cri_fake::faults::Fault;
use inlet_proto::runtime::v1::{
    self as cri, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::Code;
use tonic::transport::Channel;

struct Fixture {
    dir: tempfile::TempDir,
    runtime: Arc<FakeRuntime>,
    rt: RuntimeServiceClient<Channel>,
    img: ImageServiceClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Fixture {
    async fn start() -> Self {
        Self::on(tempfile::tempdir().unwrap()).await
    }

    async fn on(dir: tempfile::TempDir) -> Self {
        let runtime =
            Arc::new(FakeRuntime::new(dir.path().join("root"), Default::default()).unwrap());
        let socket = dir.path().join("cri.sock");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = Arc::clone(&runtime);
        let path = socket.clone();
        let server = tokio::spawn(async move {
            cri_fake::serve(&path, serving, async { drop(stopped.await) })
                .await
                .unwrap()
        });
        let channel = loop {
            match inlet_proto::uds::connect(&socket).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        Self {
            dir,
            runtime,
            rt: RuntimeServiceClient::new(channel.clone()),
            img: ImageServiceClient::new(channel),
            stop: Some(stop),
            server: Some(server),
        }
    }

    async fn restart(mut self) -> Self {
        self.stop.take().unwrap().send(()).unwrap();
        self.server.take().unwrap().await.unwrap();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        Self::on(dir).await
    }

    async fn pull(&mut self, image: &str) -> String {
        let req = cri::PullImageRequest {
            image: Some(spec(image)),
            ..Default::default()
        };
        self.img
            .pull_image(req)
            .await
            .unwrap()
            .into_inner()
            .image_ref
    }

    async fn sandbox(&mut self, name: &str) -> String {
        let req = cri::RunPodSandboxRequest {
            config: Some(sandbox_config(name)),
            runtime_handler: String::new(),
        };
        self.rt
            .run_pod_sandbox(req)
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id
    }
}

fn spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.into(),
        ..Default::default()
    }
}

fn sandbox_config(name: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: [("io.kubernetes.pod.name".to_string(), name.to_string())].into(),
        ..Default::default()
    }
}

fn container(name: &str, image: &str, mounts: Vec<cri::Mount>) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(spec(image)),
        mounts,
        ..Default::default()
    }
}

fn create(sandbox: &str, config: cri::ContainerConfig) -> cri::CreateContainerRequest {
    cri::CreateContainerRequest {
        pod_sandbox_id: sandbox.into(),
        config: Some(config),
        sandbox_config: Some(sandbox_config("p")),
    }
}

#[tokio::test]
async fn version_and_status_answer_like_a_runtime() {
    let mut f = Fixture::start().await;
    let v =
        f.rt.version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("cri-fake", "v1")
    );
    let status =
        f.rt.status(cri::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
    assert!(status.conditions.iter().all(|c| c.status) && status.conditions.len() == 2);
}

#[tokio::test]
async fn a_pod_runs_through_its_whole_lifecycle() {
    let mut f = Fixture::start().await;
    let image_ref = f.pull("busybox").await;
    let host = f.dir.path().join("volume");
    std::fs::create_dir_all(&host).unwrap();
    let sandbox = f.sandbox("web").await;
    let mount = cri::Mount {
        container_path: "/data".into(),
        host_path: host.display().to_string(),
        readonly: true,
        ..Default::default()
    };
    let id =
        f.rt.create_container(create(
            &sandbox,
            container("app", "docker.io/library/busybox:latest", vec![mount]),
        ))
        .await
        .unwrap()
        .into_inner()
        .container_id;
    f.rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();

    let status =
        f.rt.container_status(cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(status.state, cri::ContainerState::ContainerRunning as i32);
    assert_eq!(status.image_ref, image_ref);
    assert_eq!(
        (
            status.mounts[0].container_path.as_str(),
            status.mounts[0].readonly
        ),
        ("/data", true)
    );
    let listed =
        f.rt.list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: sandbox.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.containers.len(), 1);
    let pod =
        f.rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pod.status.unwrap().state,
        cri::PodSandboxState::SandboxReady as i32
    );

    let remove = cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox.clone(),
    };
    assert_eq!(
        f.rt.remove_pod_sandbox(remove.clone())
            .await
            .unwrap_err()
            .code(),
        Code::FailedPrecondition,
        "stop before remove"
    );
    f.rt.stop_container(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    f.rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.clone(),
    })
    .await
    .unwrap();
    f.rt.remove_pod_sandbox(remove).await.unwrap();
    assert!(
        f.runtime.containers().is_empty() && f.runtime.sandboxes().is_empty(),
        "removing the sandbox removes its containers"
    );
    let methods: Vec<&str> = f.runtime.calls().into_iter().map(|c| c.method).collect();
    assert_eq!(methods.first(), Some(&"PullImage"));
    assert!(methods.contains(&"StartContainer"));
}

#[tokio::test]
async fn stop_and_remove_of_missing_things_succeed() {
    let mut f = Fixture::start().await;
    f.rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: "nope".into(),
    })
    .await
    .unwrap();
    f.rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: "nope".into(),
    })
    .await
    .unwrap();
    f.rt.stop_container(cri::StopContainerRequest {
        container_id: "nope".into(),
        timeout: 0,
    })
    .await
    .unwrap();
    f.rt.remove_container(cri::RemoveContainerRequest {
        container_id: "nope".into(),
    })
    .await
    .unwrap();
    f.img
        .remove_image(cri::RemoveImageRequest {
            image: Some(spec("never-pulled")),
        })
        .await
        .unwrap();
    let status =
        f.rt.container_status(cri::ContainerStatusRequest {
            container_id: "nope".into(),
            verbose: false,
        })
        .await;
    assert_eq!(status.unwrap_err().code(), Code::NotFound);
}

#[tokio::test]
async fn real_runtime_checks_are_made() {
    let mut f = Fixture::start().await;
    let sandbox = f.sandbox("web").await;
    // The same sandbox name twice: containerd refuses the reserved name.
    let again =
        f.rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("web")),
            runtime_handler: String::new(),
        })
        .await;
    assert!(again.unwrap_err().message().contains("is reserved"));
    // An image that was never pulled.
    let err =
        f.rt.create_container(create(&sandbox, container("app", "busybox", vec![])))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("busybox"), "{}", err.message());
    f.pull("busybox").await;
    // A mount whose host path does not exist.
    let missing = cri::Mount {
        container_path: "/data".into(),
        host_path: "/nonexistent/inlet/volume".into(),
        ..Default::default()
    };
    let err =
        f.rt.create_container(create(&sandbox, container("app", "busybox", vec![missing])))
            .await
            .unwrap_err();
    assert!(
        err.message().contains("/nonexistent/inlet/volume") && err.message().contains("/data"),
        "{}",
        err.message()
    );
    // An unknown sandbox.
    let err =
        f.rt.create_container(create("nope", container("app", "busybox", vec![])))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // Starting twice.
    let id =
        f.rt.create_container(create(&sandbox, container("app", "busybox", vec![])))
            .await
            .unwrap()
            .into_inner()
            .container_id;
    f.rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    let err =
        f.rt.start_container(cri::StartContainerRequest { container_id: id })
            .await
            .unwrap_err();
    assert!(
        err.message().contains("CONTAINER_RUNNING"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn images_are_found_by_any_name_and_survive_a_restart() {
    let mut f = Fixture::start().await;
    let id = f.pull("busybox:1.36").await;
    let status = |f: &mut Fixture, name: &str| {
        let mut img = f.img.clone();
        let name = name.to_string();
        async move {
            img.image_status(cri::ImageStatusRequest {
                image: Some(spec(&name)),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .image
        }
    };
    for name in [
        "busybox:1.36",
        "docker.io/library/busybox:1.36",
        id.as_str(),
    ] {
        assert_eq!(
            status(&mut f, name).await.map(|i| i.id),
            Some(id.clone()),
            "{name}"
        );
    }
    assert!(
        status(&mut f, "busybox:1.37").await.is_none(),
        "a missing image is None, not an error"
    );
    let bad = f
        .img
        .pull_image(cri::PullImageRequest {
            image: Some(spec("Not Valid")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);

    let mut f = f.restart().await;
    assert_eq!(status(&mut f, "busybox:1.36").await.map(|i| i.id), Some(id));
    let fs = f
        .img
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(fs.image_filesystems[0].used_bytes.as_ref().unwrap().value > 0);
}

#[tokio::test]
async fn faults_fail_or_delay_calls_as_configured() {
    let mut f = Fixture::start().await;
    f.runtime.set_fault(
        "PullImage",
        Fault {
            code: Some(Code::Unavailable),
            message: "registry is down".into(),
            times: Some(1),
            ..Default::default()
        },
    );
    let err = f
        .img
        .pull_image(cri::PullImageRequest {
            image: Some(spec("busybox")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::Unavailable, "registry is down")
    );
    f.pull("busybox").await; // only the first call was affected

    f.runtime.set_fault(
        "RunPodSandbox",
        Fault {
            delay: Some(Duration::from_millis(300)),
            ..Default::default()
        },
    );
    let mut req = tonic::Request::new(cri::RunPodSandboxRequest {
        config: Some(sandbox_config("slow")),
        runtime_handler: String::new(),
    });
    req.set_timeout(Duration::from_millis(50));
    let code = f.rt.run_pod_sandbox(req).await.unwrap_err().code();
    assert!(
        matches!(code, Code::DeadlineExceeded | Code::Cancelled),
        "the caller's deadline cuts the delay short: {code:?}"
    );
    f.runtime.clear_faults();
    f.sandbox("fast").await;
}

#[tokio::test]
async fn an_unknown_runtime_handler_is_refused_as_containerd_refuses_it() {
    let mut f = Fixture::start().await;
    let status =
        f.rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("kata")),
            runtime_handler: "kata".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::Unknown,
            "failed to get sandbox runtime: no runtime for \"kata\" is configured"
        )
    );
    f.rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(sandbox_config("runc")),
        runtime_handler: "runc".into(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn exec_sync_runs_a_command_in_a_running_container_only() {
    let mut f = Fixture::start().await;
    f.pull("busybox").await;
    let sandbox = f.sandbox("exec").await;
    let mut config = container("app", "busybox", vec![]);
    config.command = vec!["sleep".into(), "3600".into()];
    config.envs = vec![cri::KeyValue {
        key: "WHO".into(),
        value: "app".into(),
    }];
    let id =
        f.rt.create_container(create(&sandbox, config))
            .await
            .unwrap()
            .into_inner()
            .container_id;
    let exec = |cmd: &[&str], timeout| cri::ExecSyncRequest {
        container_id: id.clone(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout,
    };
    let refused = f.rt.exec_sync(exec(&["true"], 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    f.rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    let reply =
        f.rt.exec_sync(exec(&["sh", "-c", "echo $WHO; exit 3"], 0))
            .await
            .unwrap()
            .into_inner();
    assert_eq!((reply.stdout, reply.exit_code), (b"app\n".to_vec(), 3));
    let slow = f.rt.exec_sync(exec(&["sleep", "5"], 1)).await.unwrap_err();
    assert_eq!(slow.code(), Code::DeadlineExceeded, "{slow:?}");
    let unknown = cri::ExecSyncRequest {
        container_id: "nope".into(),
        ..exec(&["true"], 0)
    };
    let missing = f.rt.exec_sync(unknown).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
}
