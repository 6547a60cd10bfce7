//! Container lifecycle handlers (`pkg/kubelet/lifecycle/handlers.go` handlerRunner): `exec` runs the
//! command in the container through CRI ExecSync (no timeout: the caller bounds it), `httpGet` sends a GET
//! to the pod's IP (or the handler's host) with its headers, `sleep` waits.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::Kubelet;

/// Why a handler failed, in upstream's words where it has them.
#[derive(Debug, thiserror::Error)]
pub(super) enum HookError {
    /// The command ran and exited non-zero (`RunInContainer`).
    #[error("command '{command}' exited with {code}: {stderr}")]
    Exited {
        /// The command, joined by spaces.
        command: String,
        /// Its exit code.
        code: i32,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// The runtime or the network refused.
    #[error("{0}")]
    Failed(String),
}

impl Kubelet {
    /// `Run`: one lifecycle handler of `container` (runtime id `id`).
    pub(super) async fn run_handler(
        &self,
        pod: &Pod,
        container: &Container,
        id: &str,
        handler: &LifecycleHandler,
    ) -> Result<(), HookError> {
        if let Some(exec) = &handler.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            let request = cri::ExecSyncRequest {
                container_id: id.to_string(),
                cmd: cmd.clone(),
                timeout: 0,
            };
            let reply = self.cri.exec.clone().exec_sync(request).await;
            let reply = reply
                .map_err(|s| HookError::Failed(s.message().to_string()))?
                .into_inner();
            return match reply.exit_code {
                0 => Ok(()),
                code => Err(HookError::Exited {
                    command: cmd.join(" "),
                    code,
                    stderr: String::from_utf8_lossy(&reply.stderr).into_owned(),
                }),
            };
        }
        if let Some(get) = &handler.http_get {
            return self.run_http_handler(pod, container, get).await;
        }
        if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            return Ok(());
        }
        Err(HookError::Failed(format!("invalid handler: {handler:?}")))
    }

    /// `runHTTPHandler`: a GET to the handler's host, else the pod's IP; only a failed request fails
    /// the hook (upstream does not look at the status code).
    async fn run_http_handler(
        &self,
        pod: &Pod,
        container: &Container,
        get: &HTTPGetAction,
    ) -> Result<(), HookError> {
        let host = match get.host.clone().filter(|h| !h.is_empty()) {
            Some(host) => host,
            None => self
                .pod_ip(pod)
                .await
                .ok_or_else(|| HookError::Failed("failed to find networking container".into()))?,
        };
        let port = resolve_port(&get.port, container)?;
        if get.scheme.as_deref().is_some_and(|s| s != "HTTP") {
            return Err(HookError::Failed(format!(
                "unsupported scheme {:?}: kubelet-sim sends lifecycle hooks over HTTP only",
                get.scheme.as_deref().unwrap_or_default()
            )));
        }
        let path = get.path.as_deref().unwrap_or_default();
        let path = path.strip_prefix('/').unwrap_or(path);
        let host_port = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let mut request = http::Request::get(format!("http://{host_port}/{path}"))
            .header("User-Agent", "kube-lifecycle/1.35")
            .header("Accept", "*/*");
        for header in get.http_headers.iter().flatten() {
            request = request.header(&header.name, &header.value);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| HookError::Failed(e.to_string()))?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        let response = client
            .request(request)
            .await
            .map_err(|e| HookError::Failed(e.to_string()))?;
        // The body is read and dropped (`discardHTTPRespBody`).
        let _ = response.into_body().collect().await;
        Ok(())
    }

    /// The pod's IP, as its sandbox's status has it.
    async fn pod_ip(&self, pod: &Pod) -> Option<String> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let sandbox = self.pods.lock().get(uid)?.sandbox_id.clone()?;
        self.sandbox_ip(sandbox).await
    }

    /// A sandbox's IP, as its status has it.
    pub(super) async fn sandbox_ip(&self, sandbox: String) -> Option<String> {
        let status = self
            .cri
            .runtime
            .clone()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sandbox,
                verbose: false,
            })
            .await
            .ok()?
            .into_inner()
            .status?;
        status.network.map(|n| n.ip).filter(|ip| !ip.is_empty())
    }
}

/// `resolvePort`: a number, a number as a string, or the name of one of the container's ports; an empty
/// string is port 80.
fn resolve_port(port: &IntOrString, container: &Container) -> Result<i32, HookError> {
    match port {
        IntOrString::Int(port) => Ok(*port),
        IntOrString::String(name) if name.is_empty() => Ok(80),
        IntOrString::String(name) => name
            .parse()
            .ok()
            .or_else(|| {
                container
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .map(|p| p.container_port)
            })
            .ok_or_else(|| HookError::Failed(format!("couldn't find port: {name}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    #[test]
    fn ports_resolve_as_upstream_does() {
        let container = Container {
            ports: Some(vec![ContainerPort {
                name: Some("web".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        let port = |p: IntOrString| resolve_port(&p, &container).ok();
        assert_eq!(port(IntOrString::Int(81)), Some(81));
        assert_eq!(port(IntOrString::String("82".into())), Some(82));
        assert_eq!(port(IntOrString::String("web".into())), Some(8080));
        assert_eq!(port(IntOrString::String(String::new())), Some(80));
        assert_eq!(port(IntOrString::String("db".into())), None);
    }
}
