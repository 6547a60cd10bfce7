//! A CSI call as a record: which RPC, on which volume and paths, with which context and capability, and
//! how it ended. The simulated kubelet's CSI client reports each call it makes as a [`CsiCall`], and the
//! drivers' `--call-log` writes each call they receive in the same form, so the two can be compared call by
//! call. Secrets keep only their key names; service-account tokens are redacted.

use std::collections::{BTreeMap, HashMap};

use tonic::Status;

use crate::csi::v1 as csi;

/// The volume-context key whose value carries service-account tokens: never reported.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// One CSI call as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CsiCall {
    /// The driver's name.
    pub driver: String,
    /// The RPC (`NodePublishVolume`).
    pub method: String,
    /// The volume handle.
    pub volume_id: String,
    /// `target_path`, when the call has one.
    pub target_path: String,
    /// `staging_target_path`, when the call has one.
    pub staging_path: String,
    /// The `readonly` flag.
    pub readonly: bool,
    /// The volume context (tokens redacted).
    pub volume_context: BTreeMap<String, String>,
    /// The names of the secrets' keys, never their values.
    pub secret_keys: Vec<String>,
    /// The publish context.
    pub publish_context: BTreeMap<String, String>,
    /// `OK` or the gRPC code's name.
    pub code: String,
    /// The driver's error message (empty when OK): the evidence a failed call leaves.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The capability's access mode (`SINGLE_NODE_WRITER`), when the call has a capability.
    pub access_mode: String,
    /// The capability's `volume_mount_group` (the fsGroup a VOLUME_MOUNT_GROUP driver applies).
    pub volume_mount_group: String,
    /// The capability's access type, `Mount` or `Block`, when the call has a capability.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub access_type: String,
    /// The capability's mount flags, values redacted but for SELinux contexts ([`redact_mount_flag`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_flags: Vec<String>,
}

/// What a call's report needs from its request.
#[derive(Default)]
pub struct CallInfo<'a> {
    volume_id: &'a str,
    target_path: &'a str,
    staging_path: &'a str,
    readonly: bool,
    volume_context: Option<&'a HashMap<String, String>>,
    secrets: Option<&'a HashMap<String, String>>,
    publish_context: Option<&'a HashMap<String, String>>,
    capability: Option<&'a csi::VolumeCapability>,
}

/// A CSI request a [`CsiCall`] can be made of: its method's name and the fields the record keeps.
pub trait CallRequest {
    /// The RPC's name (`NodePublishVolume`).
    const METHOD: &'static str;
    /// The fields a record keeps.
    fn info(&self) -> CallInfo<'_>;
}

macro_rules! call_request {
    ($request:ty, $method:literal) => {
        call_request!($request, $method, |_r| CallInfo::default());
    };
    ($request:ty, $method:literal, |$r:ident| $info:expr) => {
        impl CallRequest for $request {
            const METHOD: &'static str = $method;
            fn info(&self) -> CallInfo<'_> {
                let $r = self;
                $info
            }
        }
    };
}

call_request!(csi::NodePublishVolumeRequest, "NodePublishVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.target_path,
        staging_path: &r.staging_target_path,
        readonly: r.readonly,
        volume_context: Some(&r.volume_context),
        secrets: Some(&r.secrets),
        publish_context: Some(&r.publish_context),
        capability: r.volume_capability.as_ref(),
    }
});
call_request!(
    csi::NodeUnpublishVolumeRequest,
    "NodeUnpublishVolume",
    |r| CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.target_path,
        ..Default::default()
    }
);
call_request!(csi::NodeStageVolumeRequest, "NodeStageVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        staging_path: &r.staging_target_path,
        volume_context: Some(&r.volume_context),
        secrets: Some(&r.secrets),
        publish_context: Some(&r.publish_context),
        capability: r.volume_capability.as_ref(),
        ..Default::default()
    }
});
call_request!(csi::NodeUnstageVolumeRequest, "NodeUnstageVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        staging_path: &r.staging_target_path,
        ..Default::default()
    }
});
call_request!(csi::NodeGetVolumeStatsRequest, "NodeGetVolumeStats", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.volume_path,
        staging_path: &r.staging_target_path,
        ..Default::default()
    }
});
call_request!(csi::NodeExpandVolumeRequest, "NodeExpandVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.volume_path,
        staging_path: &r.staging_target_path,
        secrets: Some(&r.secrets),
        capability: r.volume_capability.as_ref(),
        ..Default::default()
    }
});
call_request!(csi::NodeGetCapabilitiesRequest, "NodeGetCapabilities");
call_request!(csi::NodeGetInfoRequest, "NodeGetInfo");
call_request!(csi::GetPluginInfoRequest, "GetPluginInfo");
call_request!(csi::GetPluginCapabilitiesRequest, "GetPluginCapabilities");
call_request!(csi::ProbeRequest, "Probe");
call_request!(csi::ListVolumesRequest, "ListVolumes");
call_request!(csi::GetCapacityRequest, "GetCapacity");
call_request!(
    csi::ValidateVolumeCapabilitiesRequest,
    "ValidateVolumeCapabilities",
    |r| CallInfo {
        volume_id: &r.volume_id,
        volume_context: Some(&r.volume_context),
        secrets: Some(&r.secrets),
        capability: r.volume_capabilities.first(),
        ..Default::default()
    }
);
call_request!(
    csi::ControllerGetVolumeRequest,
    "ControllerGetVolume",
    |r| {
        CallInfo {
            volume_id: &r.volume_id,
            ..Default::default()
        }
    }
);
call_request!(
    csi::ControllerGetCapabilitiesRequest,
    "ControllerGetCapabilities"
);
call_request!(csi::CreateVolumeRequest, "CreateVolume", |r| {
    // The volume has no id yet: the record keeps the name the CO asked for.
    CallInfo {
        volume_id: &r.name,
        secrets: Some(&r.secrets),
        capability: r.volume_capabilities.first(),
        ..Default::default()
    }
});
call_request!(
    csi::ControllerExpandVolumeRequest,
    "ControllerExpandVolume",
    |r| CallInfo {
        volume_id: &r.volume_id,
        secrets: Some(&r.secrets),
        capability: r.volume_capability.as_ref(),
        ..Default::default()
    }
);
call_request!(csi::DeleteVolumeRequest, "DeleteVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        secrets: Some(&r.secrets),
        ..Default::default()
    }
});
call_request!(
    csi::ControllerPublishVolumeRequest,
    "ControllerPublishVolume",
    |r| CallInfo {
        volume_id: &r.volume_id,
        readonly: r.readonly,
        volume_context: Some(&r.volume_context),
        secrets: Some(&r.secrets),
        capability: r.volume_capability.as_ref(),
        ..Default::default()
    }
);
call_request!(
    csi::ControllerUnpublishVolumeRequest,
    "ControllerUnpublishVolume",
    |r| CallInfo {
        volume_id: &r.volume_id,
        secrets: Some(&r.secrets),
        ..Default::default()
    }
);

impl CsiCall {
    /// The record of `request` sent to `driver`, answered with `failure` (None: OK). Secrets keep only
    /// their key names; service-account tokens are redacted.
    pub fn of<R: CallRequest>(driver: &str, request: &R, failure: Option<&Status>) -> Self {
        let info = request.info();
        let map = |m: Option<&HashMap<String, String>>| -> BTreeMap<String, String> {
            m.into_iter()
                .flatten()
                .map(|(k, v)| {
                    let value = if k == TOKENS_KEY {
                        redact_tokens(v)
                    } else {
                        v.clone()
                    };
                    (k.clone(), value)
                })
                .collect()
        };
        let mut secret_keys: Vec<String> = info
            .secrets
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect();
        secret_keys.sort();
        let mut call = CsiCall {
            driver: driver.to_string(),
            method: R::METHOD.to_string(),
            volume_id: info.volume_id.to_string(),
            target_path: info.target_path.to_string(),
            staging_path: info.staging_path.to_string(),
            readonly: info.readonly,
            volume_context: map(info.volume_context),
            secret_keys,
            publish_context: map(info.publish_context),
            code: String::new(),
            message: String::new(),
            access_mode: info
                .capability
                .and_then(|c| c.access_mode.as_ref())
                .and_then(|m| csi::volume_capability::access_mode::Mode::try_from(m.mode).ok())
                .map(|m| m.as_str_name().to_string())
                .unwrap_or_default(),
            volume_mount_group: match info.capability.and_then(|c| c.access_type.as_ref()) {
                Some(csi::volume_capability::AccessType::Mount(m)) => m.volume_mount_group.clone(),
                _ => String::new(),
            },
            access_type: match info.capability.and_then(|c| c.access_type.as_ref()) {
                Some(csi::volume_capability::AccessType::Mount(_)) => "Mount".into(),
                Some(csi::volume_capability::AccessType::Block(_)) => "Block".into(),
                None => String::new(),
            },
            mount_flags: match info.capability.and_then(|c| c.access_type.as_ref()) {
                Some(csi::volume_capability::AccessType::Mount(m)) => {
                    m.mount_flags.iter().map(|f| redact_mount_flag(f)).collect()
                }
                _ => Vec::new(),
            },
        };
        call.answered(failure, None);
        call
    }

    /// The record of a call sent with no answer yet (see [`CsiCall::of`]) completed with its answer:
    /// `failure` (None: OK), and the publish context a ControllerPublishVolume returned.
    pub fn answered(
        &mut self,
        failure: Option<&Status>,
        publish_context: Option<&HashMap<String, String>>,
    ) {
        self.code = match failure {
            None => "OK".into(),
            Some(status) => format!("{:?}", status.code()),
        };
        self.message = failure.map(|s| s.message().to_string()).unwrap_or_default();
        if let Some(context) = publish_context {
            self.publish_context = context
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        }
    }
}

/// A mount flag as a record keeps it: a PV's `mountOptions` may carry credentials (`password=` of a CIFS
/// share), so a value is kept only for an SELinux context option as the kubelet adds it: one quoted
/// value and nothing after it (an entry such as `context="x",password=y` is redacted whole).
pub fn redact_mount_flag(flag: &str) -> String {
    const CONTEXTS: [&str; 4] = ["context", "fscontext", "defcontext", "rootcontext"];
    let Some((key, value)) = flag.split_once('=') else {
        return flag.to_string();
    };
    let quoted = value.len() >= 2
        && value.starts_with('"')
        && value.ends_with('"')
        && !value[1..value.len() - 1].contains('"');
    match CONTEXTS.contains(&key) && quoted {
        true => flag.to_string(),
        false => format!("{key}=<redacted>"),
    }
}

/// The tokens' JSON with every `token` replaced by `<redacted>`: audiences and expiry times stay
/// visible; anything unexpected is redacted whole.
fn redact_tokens(value: &str) -> String {
    let Ok(serde_json::Value::Object(mut audiences)) = serde_json::from_str(value) else {
        return "<redacted>".into();
    };
    for status in audiences.values_mut() {
        match status.as_object_mut() {
            Some(status) => {
                status.insert("token".into(), "<redacted>".into());
            }
            None => *status = "<redacted>".into(),
        }
    }
    serde_json::Value::Object(audiences).to_string()
}

/// `rpc error: code = X desc = Y`, the way Go's gRPC prints a status, which users know from events.
pub fn rpc_error(status: &Status) -> String {
    // tonic reports a call that outlived its timeout as CANCELLED "Timeout expired"; grpc-go, which the
    // kubelet's events come from, as DEADLINE_EXCEEDED with the context's text.
    if status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired" {
        return "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into();
    }
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_flags_keep_contexts_and_lose_other_values() {
        let mount = csi::volume_capability::MountVolume {
            mount_flags: vec![
                "noatime".into(),
                "password=hunter2".into(),
                "context=\"system_u:object_r:container_file_t:s0:c0,c1\"".into(),
                "context=\"x\",password=hunter2".into(),
            ],
            ..Default::default()
        };
        let request = csi::NodePublishVolumeRequest {
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(mount)),
                access_mode: None,
            }),
            ..Default::default()
        };
        let call = CsiCall::of("d", &request, None);
        assert_eq!(
            call.mount_flags,
            [
                "noatime",
                "password=<redacted>",
                "context=\"system_u:object_r:container_file_t:s0:c0,c1\"",
                "context=<redacted>"
            ]
        );
    }
}
