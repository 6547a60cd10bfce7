//! The run's report: JSON for scripts (documented in `kubelet-sim/README.md`) and a summary table for people.

use std::io::Write;

use inlet_proto::csi_call::CsiCall;
use inlet_proto::peer_text::safe;
use serde::Serialize;

use crate::api::manifest::EXPECTED_PHASE_ANNOTATION;
use crate::api::{Api, ApiPod, ApiRead};
use crate::controllers::attach_detach::AttachmentReport;
use crate::node::ContainerReport;

/// The JSON report. Field names are a contract: add, never rename.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// Every pod, as it was when the run settled (before any teardown).
    pub pods: Vec<PodReport>,
    /// Every CSI call, in order (secret key names only; tokens redacted).
    pub csi_calls: Vec<CsiCall>,
    /// Every read of a Secret, CSIDriver, PVC, PV, ServiceAccount or VolumeAttachment by a node or controller.
    pub api_reads: Vec<ApiRead>,
    /// Every VolumeAttachment that existed during the run, with its last state.
    pub volume_attachments: Vec<AttachmentReport>,
    /// Objects admission refused.
    pub rejected: Vec<Rejection>,
    /// What `--teardown` left behind (absent without `--teardown`).
    pub teardown: Option<TeardownReport>,
}

/// One pod.
#[derive(Debug, Clone, Serialize)]
pub struct PodReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The node it was bound to.
    pub node: String,
    /// Its phase (`Running`, `Pending`).
    pub phase: String,
    /// What the manifest expected (`inlet.dev/expected-phase`, default `Running`).
    pub expected_phase: String,
    /// Its volumes' names.
    pub volumes: Vec<String>,
    /// Its events, oldest first.
    pub events: Vec<EventReport>,
    /// Its containers, with the mounts the runtime reports.
    pub containers: Vec<ContainerReport>,
    /// Its init containers, in the same shape.
    pub init_containers: Vec<ContainerReport>,
    /// Its conditions as the API has them.
    pub conditions: Vec<ConditionReport>,
}

/// One pod condition.
#[derive(Debug, Clone, Serialize)]
pub struct ConditionReport {
    /// `Ready`, `Initialized`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, when not plain.
    pub reason: Option<String>,
    /// In full.
    pub message: Option<String>,
}

/// One event.
#[derive(Debug, Clone, Serialize)]
pub struct EventReport {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `FailedMount`, `Started`, ...
    pub reason: String,
    /// The message.
    pub message: String,
    /// How often it happened.
    pub count: i32,
    /// The container it is about (`spec.containers{app}`), for a container's events.
    pub field_path: Option<String>,
}

impl From<k8s_openapi::api::core::v1::Event> for EventReport {
    fn from(e: k8s_openapi::api::core::v1::Event) -> Self {
        Self {
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
            count: e.count.unwrap_or(1),
            field_path: e.involved_object.field_path,
        }
    }
}

/// An object admission refused.
#[derive(Debug, Clone, Serialize)]
pub struct Rejection {
    /// Where it came from (`file#document`).
    pub origin: String,
    /// The API server's message.
    pub message: String,
    /// The manifest expected it (`inlet.dev/expected-phase: Rejected`).
    pub expected: bool,
}

/// What teardown left.
#[derive(Debug, Clone, Serialize, Default)]
pub struct TeardownReport {
    /// Every pod was deleted and its volumes torn down before the timeout.
    pub complete: bool,
    /// Mount points left under the root.
    pub leftover_mounts: Vec<String>,
    /// Pod directories left under the root.
    pub leftover_pod_dirs: Vec<String>,
    /// VolumeAttachments left.
    pub leftover_attachments: Vec<String>,
    /// Image volume state left: records, shared image mounts' dirs, writable layers (of the kubelet-side
    /// plugin and of in-process image drivers).
    pub leftover_image_state: Vec<String>,
    /// Pods of the run still in the API at the deadline (`namespace/name`): what an incomplete teardown
    /// was waiting for.
    pub leftover_pods: Vec<String>,
    /// Container log directories left under the roots (`logs/<namespace>_<name>_<uid>`).
    pub leftover_log_dirs: Vec<String>,
}

impl TeardownReport {
    /// Everything was deleted and nothing is left.
    pub fn clean(&self) -> bool {
        self.complete
            && self.leftover_mounts.is_empty()
            && self.leftover_pod_dirs.is_empty()
            && self.leftover_attachments.is_empty()
            && self.leftover_image_state.is_empty()
            && self.leftover_pods.is_empty()
            && self.leftover_log_dirs.is_empty()
    }
}

impl PodReport {
    /// The report of `pod` as the API has it, with its events and the containers (init and regular) its
    /// node reports.
    pub fn of(pod: &ApiPod, api: &Api, containers: Vec<ContainerReport>) -> Self {
        let (init_containers, containers) = containers.into_iter().partition(|c| c.init);
        let conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .map(|c| ConditionReport {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        PodReport {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            phase: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into()),
            expected_phase: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(EXPECTED_PHASE_ANNOTATION).cloned())
                .unwrap_or_else(|| "Running".into()),
            volumes: pod.volumes().iter().map(|v| v.name().to_string()).collect(),
            events: api
                .events_for(&uid)
                .into_iter()
                .map(EventReport::from)
                .collect(),
            containers,
            init_containers,
            conditions,
            uid,
            node,
        }
    }
}

impl PodReport {
    /// True when the pod is where its manifest expected it.
    pub fn as_expected(&self) -> bool {
        match self.expected_phase.as_str() {
            "Pending" => {
                self.phase == "Pending" && self.events.iter().any(|e| e.type_ == "Warning")
            }
            expected => self.phase == expected,
        }
    }
}

impl Report {
    /// The Secrets the nodes read, as `namespace/name`.
    pub fn secrets_read(&self) -> std::collections::BTreeSet<String> {
        self.api_reads
            .iter()
            .filter(|r| r.kind == "Secret")
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect()
    }

    /// True when every pod reached its expected state, every rejection was expected, and a teardown (if
    /// any) left nothing behind.
    pub fn as_expected(&self) -> bool {
        self.pods.iter().all(PodReport::as_expected)
            && self.rejected.iter().all(|r| r.expected)
            && self.teardown.as_ref().is_none_or(TeardownReport::clean)
    }

    /// The summary table: pods, phase, volumes, and the last warning of each pod not as expected.
    pub fn write_summary(&self, out: &mut impl Write) -> std::io::Result<()> {
        let rows: Vec<[String; 5]> = self
            .pods
            .iter()
            .map(|p| {
                let last = p
                    .events
                    .iter()
                    .rev()
                    .find(|e| e.type_ == "Warning")
                    // A driver's error text is in the message: shown escaped, never raw.
                    .map(|e| safe(&format!("{}: {}", e.reason, e.message)));
                let note = if p.as_expected() {
                    "-".to_string()
                } else {
                    last.unwrap_or_else(|| "no event yet".into())
                };
                [
                    format!("{}/{}", p.namespace, p.name),
                    p.node.clone(),
                    phase_cell(p),
                    p.volumes.join(","),
                    note,
                ]
            })
            .collect();
        let headers = ["POD", "NODE", "PHASE", "VOLUMES", "LAST WARNING"];
        let mut widths = headers.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row).take(4) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |cells: [&str; 5]| {
            format!(
                "{:w0$}  {:w1$}  {:w2$}  {:w3$}  {}",
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                cells[4],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3]
            )
        };
        writeln!(out, "{}", line(headers))?;
        for row in &rows {
            writeln!(
                out,
                "{}",
                line([&row[0], &row[1], &row[2], &row[3], &row[4]])
            )?;
        }
        for r in &self.rejected {
            let expected = if r.expected { " (expected)" } else { "" };
            writeln!(
                out,
                "rejected{expected} {}: {}",
                safe(&r.origin),
                safe(&r.message)
            )?;
        }
        let running = self.pods.iter().filter(|p| p.phase == "Running").count();
        let expected = self.pods.iter().filter(|p| p.as_expected()).count();
        writeln!(
            out,
            "{} pods: {running} Running, {expected} as expected; {} CSI calls",
            self.pods.len(),
            self.csi_calls.len()
        )?;
        if let Some(t) = &self.teardown {
            match t.clean() {
                true => writeln!(
                    out,
                    "teardown: every pod deleted; no mount, pod directory, log directory, attachment or image volume state left"
                )?,
                false => writeln!(
                    out,
                    "teardown: INCOMPLETE: {} pods not deleted{}, {} mounts, {} pod dirs, {} log dirs, {} attachments, {} image volume state entries left",
                    t.leftover_pods.len(),
                    match t.leftover_pods.first() {
                        Some(first) => format!(" (first {})", safe(first)),
                        None => String::new(),
                    },
                    t.leftover_mounts.len(),
                    t.leftover_pod_dirs.len(),
                    t.leftover_log_dirs.len(),
                    t.leftover_attachments.len(),
                    t.leftover_image_state.len()
                )?,
            }
        }
        Ok(())
    }
}

fn phase_cell(p: &PodReport) -> String {
    match p.expected_phase.as_str() {
        "Running" => p.phase.clone(),
        expected => format!("{} (expected {expected})", p.phase),
    }
}
