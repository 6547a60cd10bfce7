//! `kubelet-sim bench pods --kubeconfig`: the pods bench on a real cluster. M hollow nodes join it (in this
//! process or over `--processes` children, as `bench hollow-nodes` runs them), then N pods with K inline CSI
//! volumes each are created through its API server, bound round-robin to the nodes (`spec.nodeName`: the
//! scheduler is not measured), and run through the hollow kubelets: how long until every pod runs, each
//! pod's start (from its create to a watch seeing it Running), the teardown, and how much of the time was
//! the API server's, read from its own `/metrics` (`process_cpu_seconds_total`, `apiserver_request_total`,
//! `apiserver_request_duration_seconds`) before and after. The pods are deleted and the nodes leave the
//! cluster at the end, whatever happened.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;

use super::hollow::{wait, wait_nodes_ready};
use super::hollow_fleet::{Fleet, FleetConfig};
use super::{BenchError, Summary, or_interrupted};
use crate::signals::Interrupts;

/// What to run.
pub struct ClusterPodsConfig {
    /// The hollow nodes.
    pub fleet: FleetConfig,
    /// Pods.
    pub pods: usize,
    /// Inline volumes per pod.
    pub volumes: usize,
    /// SIGINT/SIGTERM: the bench stops, deletes its pods, has its nodes leave, and fails with the signal.
    pub interrupts: Option<Interrupts>,
}

/// What the API server did over a span, from the difference of two reads of its `/metrics`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ApiServerShare {
    /// CPU seconds the API server's process used (`process_cpu_seconds_total`).
    pub cpu_seconds: f64,
    /// Requests it served, watches excepted (`apiserver_request_total`).
    pub requests: f64,
    /// The time those requests took inside it, summed (`apiserver_request_duration_seconds_sum`).
    pub request_seconds: f64,
}

impl ApiServerShare {
    /// What the API server did since the counters were `before`.
    fn since(&self, before: &Self) -> Self {
        Self {
            cpu_seconds: self.cpu_seconds - before.cpu_seconds,
            requests: self.requests - before.requests,
            request_seconds: self.request_seconds - before.request_seconds,
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterPodsFigures {
    /// The driver.
    pub driver: String,
    /// Pods.
    pub pods: usize,
    /// Hollow nodes.
    pub nodes: usize,
    /// Inline volumes per pod.
    pub volumes: usize,
    /// Processes the nodes ran in.
    pub processes: usize,
    /// Seconds until every hollow node was Ready.
    pub register_seconds: f64,
    /// Whether every pod ran within the limit.
    pub settled: bool,
    /// Seconds from the first create until every pod was created.
    pub create_seconds: f64,
    /// Seconds from the first create until a watch saw the last pod Running.
    pub settle_seconds: f64,
    /// Seconds from the first delete until every pod was gone from the API.
    pub teardown_seconds: f64,
    /// Each pod's start: from its create request to a watch seeing it Running.
    pub pod_start: Summary,
    /// The API server's work while the pods were created and started.
    pub api_server: ApiServerShare,
    /// CPU seconds the hollow nodes' processes used over the same span.
    pub nodes_cpu_seconds: f64,
    /// The peak resident memory of the processes holding the nodes, teardown included, MiB.
    pub peak_rss_mib: u64,
    /// Every pod's start, for the chart.
    #[serde(skip)]
    pub samples: Vec<Duration>,
}

/// Pod `i`'s name.
fn pod_name(i: usize) -> String {
    format!("bench-pods-{i}")
}

/// The label the bench's pods carry.
const LABEL: &str = "inlet.dev/bench=pods";
/// Pods created at once: about what a controller's client does at its default QPS and burst, without
/// making the create phase the API server's queue.
const CREATES_IN_FLIGHT: usize = 16;
/// How often the pods seen Running are counted (a look at this process's own table).
const WATCHED: Duration = Duration::from_millis(100);

/// Runs the nodes and the pods, then deletes the pods and has the nodes leave.
pub async fn run(config: &ClusterPodsConfig) -> Result<ClusterPodsFigures, BenchError> {
    let started = Instant::now();
    let (fleet, names) = Fleet::join(&config.fleet, "bench-pods").await?;
    let pods = kube::Api::<Pod>::namespaced(config.fleet.client.clone(), "default");
    let measured = or_interrupted(
        &config.interrupts,
        measure(config, &fleet, &names, &pods, started),
    )
    .await;
    let selector = ListParams::default().labels(LABEL);
    fleet
        .leave_after(measured, &pods, &selector, config.fleet.limit)
        .await
}

/// When each of the bench's pods was created, and when a watch first saw it Running.
#[derive(Default)]
struct Times {
    created: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
}

/// Waits for the nodes, creates the pods, waits for them to run, deletes them and waits for them to go.
/// A pod's start is timed as the e2e density tests time it: from its create to the moment a watch on the
/// API server sees it Running, so it includes the pod status reaching the API.
async fn measure(
    config: &ClusterPodsConfig,
    fleet: &Fleet,
    names: &[String],
    pods: &kube::Api<Pod>,
    started: Instant,
) -> Result<ClusterPodsFigures, BenchError> {
    wait_nodes_ready(&config.fleet.client, names, config.fleet.limit).await?;
    let register_seconds = started.elapsed().as_secs_f64();
    let times = Mutex::new(Times::default());
    tokio::select! {
        figures = phases(config, fleet, names, pods, &times, register_seconds) => figures,
        ended = watch_running(pods, &times) => Err(ended),
    }
}

/// Records when each bench pod is first seen Running; returns only if the watch cannot go on.
async fn watch_running(pods: &kube::Api<Pod>, times: &Mutex<Times>) -> BenchError {
    let config = watcher::Config::default().labels(LABEL);
    let mut events = std::pin::pin!(watcher::watcher(pods.clone(), config).default_backoff());
    while let Some(event) = events.next().await {
        let (Ok(watcher::Event::Apply(pod)) | Ok(watcher::Event::InitApply(pod))) = event else {
            continue;
        };
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if let (true, Some(name)) = (running, pod.metadata.name) {
            times
                .lock()
                .running
                .entry(name)
                .or_insert_with(Instant::now);
        }
    }
    BenchError::Output("the watch on the bench's pods ended".into())
}

/// Creates the pods, waits for them to run, deletes them and waits for them to go.
async fn phases(
    config: &ClusterPodsConfig,
    fleet: &Fleet,
    names: &[String],
    pods: &kube::Api<Pod>,
    times: &Mutex<Times>,
    register_seconds: f64,
) -> Result<ClusterPodsFigures, BenchError> {
    let before = api_server_metrics(&config.fleet.client).await?;
    let cpu = fleet.cpu_time();
    let applied = Instant::now();
    futures::stream::iter(0..config.pods)
        .map(|i| create_pod(config, pods, &names[i % names.len()], i, times))
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_collect::<()>()
        .await?;
    let create_seconds = applied.elapsed().as_secs_f64();
    let settled = wait(
        "every pod Running",
        config.fleet.limit,
        WATCHED,
        async || times.lock().running.len() >= config.pods,
    )
    .await
    .is_ok();
    let nodes_cpu_seconds = (fleet.cpu_time() - cpu).as_secs_f64();
    let after = api_server_metrics(&config.fleet.client).await?;
    let (settle, mut samples) = {
        let times = times.lock();
        let last = times.running.values().max().copied().unwrap_or(applied);
        let samples: Vec<Duration> = times
            .running
            .iter()
            .filter_map(|(name, at)| Some(at.duration_since(*times.created.get(name)?)))
            .collect();
        (last.duration_since(applied), samples)
    };
    let pod_start = Summary::of(&mut samples, settle);

    // Listed from the watch cache, as the nodes are: a list of 10,000 pods is tens of megabytes the API
    // server encodes each time.
    let listed = ListParams::default().labels(LABEL).match_any();
    let every = Duration::from_millis(200).max(Duration::from_micros(config.pods as u64 * 100));
    // One delete per pod, a few at a time as the creates went: a DeleteCollection is worked through by
    // the API server one pod after another (`--delete-collection-workers`, 1 by default), which would
    // time the API server's loop, not the nodes' teardown.
    let deleted = Instant::now();
    futures::stream::iter(0..config.pods)
        .map(|i| async move {
            let name = pod_name(i);
            match pods.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(BenchError::Output(format!("deleting pod {name}: {e}"))),
            }
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_collect::<()>()
        .await?;
    wait("every pod gone", config.fleet.limit, every, async || {
        pods.list(&listed).await.is_ok_and(|l| l.items.is_empty())
    })
    .await?;
    let teardown_seconds = deleted.elapsed().as_secs_f64();
    let peak_rss_mib = fleet.peak_rss_mib();
    Ok(ClusterPodsFigures {
        driver: config.fleet.driver.name.clone(),
        pods: config.pods,
        nodes: config.fleet.nodes,
        volumes: config.volumes,
        processes: config.fleet.processes.max(1),
        register_seconds,
        settled,
        create_seconds,
        settle_seconds: settle.as_secs_f64(),
        teardown_seconds,
        pod_start,
        api_server: after.since(&before),
        nodes_cpu_seconds,
        peak_rss_mib,
        samples,
    })
}

/// Creates pod `i` on `node`, with the bench's inline volumes.
async fn create_pod(
    config: &ClusterPodsConfig,
    pods: &kube::Api<Pod>,
    node: &str,
    i: usize,
    times: &Mutex<Times>,
) -> Result<(), BenchError> {
    let mounts: Vec<_> = (0..config.volumes)
        .map(|v| json!({"name": format!("v{v}"), "mountPath": format!("/v{v}")}))
        .collect();
    let volumes: Vec<_> = (0..config.volumes)
        .map(|v| json!({"name": format!("v{v}"), "csi": {"driver": config.fleet.driver.name}}))
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(i), "labels": {"inlet.dev/bench": "pods"}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "app", "image": "busybox:1.36", "volumeMounts": mounts}],
            "volumes": volumes}
    }))
    .map_err(|e| BenchError::Output(e.to_string()))?;
    times.lock().created.insert(pod_name(i), Instant::now());
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| BenchError::Output(format!("creating pod {}: {e}", pod_name(i))))?;
    Ok(())
}

/// The API server's counters now, from its `/metrics` (which the cluster's admin may read).
async fn api_server_metrics(client: &kube::Client) -> Result<ApiServerShare, BenchError> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| BenchError::Output(e.to_string()))?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| BenchError::Output(format!("reading the API server's /metrics: {e}")))?;
    Ok(parse_metrics(&text))
}

/// Sums the counters [`ApiServerShare`] holds from Prometheus text; watches are left out, as they last as
/// long as their client keeps them open.
fn parse_metrics(text: &str) -> ApiServerShare {
    let mut share = ApiServerShare::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or_default();
        let watch = series.contains("verb=\"WATCH\"");
        match name {
            "process_cpu_seconds_total" => share.cpu_seconds += value,
            "apiserver_request_total" if !watch => share.requests += value,
            "apiserver_request_duration_seconds_sum" if !watch => share.request_seconds += value,
            _ => {}
        }
    }
    share
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_over_series_without_watches() {
        let text = "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
            # TYPE process_cpu_seconds_total counter\n\
            process_cpu_seconds_total 12.5\n\
            apiserver_request_total{code=\"201\",resource=\"pods\",verb=\"POST\"} 10\n\
            apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"WATCH\"} 99\n\
            apiserver_request_total{code=\"200\",resource=\"leases\",verb=\"PUT\"} 5\n\
            apiserver_request_duration_seconds_sum{resource=\"pods\",verb=\"POST\"} 0.25\n\
            apiserver_request_duration_seconds_sum{resource=\"pods\",verb=\"WATCH\"} 3600\n\
            apiserver_request_duration_seconds_count{resource=\"pods\",verb=\"POST\"} 10\n\
            apiserver_request_duration_seconds_bucket{le=\"0.1\",verb=\"POST\"} 10\n";
        let share = parse_metrics(text);
        assert_eq!(share.cpu_seconds, 12.5);
        assert_eq!(share.requests, 15.0);
        assert_eq!(share.request_seconds, 0.25);
    }
}
