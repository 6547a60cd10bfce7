//! Steps about what the API was asked, the VolumeAttachments, and what a node leaves on disk.

use super::*;

// ---- Then: API reads ----

#[then(regex = r#"^the only secrets read were "([^"]*)"$"#)]
fn secrets_read(w: &mut Sim, list: String) {
    let read = w.report().secrets_read();
    let expected: BTreeSet<String> = list
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(read, expected);
}

// ---- Then: attachments ----

#[then(
    regex = r#"^a VolumeAttachment for handle "([^"]+)" of "([^"]+)" on "([^"]+)" is attached$"#
)]
async fn attached(w: &mut Sim, handle: String, driver: String, node: String) {
    let name = attachment_name(&handle, &driver, &node);
    let api = Arc::clone(&w.sim().api);
    w.wait(&format!("{name} is attached"), |_| {
        api.peek::<VolumeAttachment>("", &name)
            .and_then(|v| v.status.clone())
            .is_some_and(|s| s.attached)
    })
    .await;
}

#[then(regex = r#"^there (?:is|are) (\d+) VolumeAttachments?$"#)]
fn attachment_count(w: &mut Sim, n: usize) {
    assert_eq!(w.sim().api.list::<VolumeAttachment>().len(), n);
}

#[then(
    regex = r#"^the VolumeAttachment for handle "([^"]+)" of "([^"]+)" on "([^"]+)" carries the inline source for namespace "([^"]+)"$"#
)]
fn attachment_copy(w: &mut Sim, handle: String, driver: String, node: String, namespace: String) {
    let va = w
        .sim()
        .api
        .peek::<VolumeAttachment>("", &attachment_name(&handle, &driver, &node))
        .expect("attachment");
    let va = std::sync::Arc::unwrap_or_clone(va);
    let csi = va
        .spec
        .source
        .inline_volume_spec
        .clone()
        .and_then(|s| s.csi)
        .expect("an inline copy");
    assert_eq!(
        (csi.driver.as_str(), csi.volume_handle.as_str()),
        (driver.as_str(), handle.as_str())
    );
    let annotation = va
        .metadata
        .annotations
        .and_then(|a| a.get("inlet.dev/inline-volume-namespace").cloned());
    assert_eq!(annotation.as_deref(), Some(namespace.as_str()));
}

#[then(
    regex = r#"^the VolumeAttachment for handle "([^"]+)" of "([^"]+)" on "([^"]+)" has a detach error saying "(.*)"$"#
)]
async fn detach_error(w: &mut Sim, handle: String, driver: String, node: String, text: String) {
    let name = attachment_name(&handle, &driver, &node);
    let api = Arc::clone(&w.sim().api);
    w.wait(
        &format!("{name} has a detach error saying {text:?}"),
        |_| {
            api.peek::<VolumeAttachment>("", &name)
                .and_then(|v| v.status.clone())
                .and_then(|s| s.detach_error)
                .and_then(|e| e.message)
                .is_some_and(|m| m.contains(&text))
        },
    )
    .await;
}

#[then(regex = r"^no VolumeAttachment is left$")]
async fn no_attachments(w: &mut Sim) {
    let api = Arc::clone(&w.sim().api);
    w.wait("no VolumeAttachment is left", |_| {
        api.list::<VolumeAttachment>().is_empty()
    })
    .await;
}

// ---- Then: the node ----

#[then(regex = r#"^the staging record of handle "([^"]+)" on "([^"]+)" is exactly (\{.*\})$"#)]
fn staging_record(w: &mut Sim, handle: String, node: String, expected: String) {
    let plugin = w
        .dir
        .path()
        .join("root")
        .join(&node)
        .join("plugins/kubernetes.io/csi");
    let records: Vec<String> = walkdir::WalkDir::new(&plugin)
        .into_iter()
        .flatten()
        .filter(|e| e.file_name() == "vol_data.json")
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    let record = records
        .iter()
        .find(|r| r.contains(&format!("{handle:?}")))
        .unwrap_or_else(|| panic!("no staging record of {handle} under {}", plugin.display()));
    assert_eq!(record, &format!("{expected}\n"));
}

#[then(regex = r"^nothing is left on the node$")]
fn nothing_left(w: &mut Sim) {
    let teardown = w
        .teardown
        .clone()
        .expect("run \"When all pods are deleted\" first");
    assert!(teardown.clean(), "{teardown:#?}");
}

#[then(
    regex = r#"^the vol_data.json of "([^"]+)" in pod "([^"]+)" records mode "(\w+)" and driver "([^"]+)"$"#
)]
fn vol_data(w: &mut Sim, volume: String, pod: String, mode: String, driver: String) {
    let node = w
        .report()
        .pods
        .iter()
        .find(|p| p.name == pod)
        .map(|p| p.node.clone())
        .expect("pod");
    let dir: PathBuf = w
        .dir
        .path()
        .join("root")
        .join(node)
        .join("pods")
        .join(w.uid(&pod))
        .join("volumes/kubernetes.io~csi")
        .join(&volume);
    let data = inlet_volume::csi::vol_data::VolData::load(&dir).expect("vol_data.json");
    assert_eq!(
        (data.lifecycle_mode.as_str(), data.driver_name.as_str()),
        (mode.as_str(), driver.as_str())
    );
    assert_eq!(data.volume_handle, w.publish_of(&pod, &volume).volume_id);
}
