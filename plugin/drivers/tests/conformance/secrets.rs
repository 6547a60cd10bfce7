//! Secrets in CSI requests never reach a log line or an error message.
//!
//! The whole test binary logs at TRACE into a buffer (handlers log from blocking-pool threads, so the
//! subscriber must be global); this test sends secrets through every call that carries them, successful and
//! failing, then searches the buffer.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use inlet_proto::csi::v1 as csi;

use crate::fixture::*;

const SECRET: &str = "hunter2-s3cr3t-value";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() -> Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
        logs
    })
    .clone()
}

fn secrets() -> HashMap<String, String> {
    [
        ("password".to_string(), SECRET.to_string()),
        ("token".to_string(), SECRET.to_string()),
    ]
    .into()
}

#[tokio::test]
async fn secrets_never_appear_in_logs_or_errors() {
    let logs = capture_logs();
    let mut f = Fixture::with(Options {
        enable_attach: true,
        ..Default::default()
    })
    .await;
    let mut errors = Vec::new();

    let req = csi::CreateVolumeRequest {
        secrets: secrets(),
        ..create("with-secrets", MI)
    };
    let id = f
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let bad = csi::CreateVolumeRequest {
        secrets: secrets(),
        ..create("bad/name", MI)
    };
    errors.push(f.controller.create_volume(bad).await.unwrap_err());
    let attach = csi::ControllerPublishVolumeRequest {
        volume_id: id.clone(),
        node_id: "node-1".into(),
        volume_capability: Some(rwo()),
        secrets: secrets(),
        ..Default::default()
    };
    f.controller
        .controller_publish_volume(attach)
        .await
        .unwrap();
    let snap = csi::CreateSnapshotRequest {
        source_volume_id: id.clone(),
        name: "s".into(),
        secrets: secrets(),
        ..Default::default()
    };
    f.controller.create_snapshot(snap).await.unwrap();

    let staging = f.kubelet_path("plugins/x/globalmount");
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    f.node
        .node_stage_volume(csi::NodeStageVolumeRequest {
            secrets: secrets(),
            ..stage(&id, &staging, rwo())
        })
        .await
        .unwrap();
    f.node
        .node_publish_volume(csi::NodePublishVolumeRequest {
            secrets: secrets(),
            ..publish(&id, &staging, &target, rwo())
        })
        .await
        .unwrap();
    let inline = f.kubelet_path("pods/p/volumes/inline/mount");
    f.node
        .node_publish_volume(csi::NodePublishVolumeRequest {
            secrets: secrets(),
            ..publish_ephemeral("csi-secret", &inline, &[])
        })
        .await
        .unwrap();
    let bad_attr = csi::NodePublishVolumeRequest {
        secrets: secrets(),
        ..publish_ephemeral("csi-bad", &inline, &[("size", SECRET)])
    };
    errors.push(f.node.node_publish_volume(bad_attr).await.unwrap_err());
    f.node
        .node_unpublish_volume(unpublish("csi-secret", &inline))
        .await
        .unwrap();
    f.node
        .node_unpublish_volume(unpublish(&id, &target))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("published volume") && text.contains("failed"),
        "the calls were logged:\n{text}"
    );
    let password_leaks = text
        .lines()
        .filter(|l| l.contains(SECRET))
        .collect::<Vec<_>>();
    // The one place the value may appear is where the caller put it in a non-secret field (the size attribute),
    // which the error names; the secrets map itself must never show up.
    assert!(
        password_leaks
            .iter()
            .all(|l| !l.contains("password") && !l.contains("secrets")),
        "secret logged: {password_leaks:?}"
    );
    for status in errors {
        assert!(
            !status.message().contains("password"),
            "{}",
            status.message()
        );
    }
}
