//! Thousands of publish and unpublish calls from many tasks at once, on overlapping volume ids and targets:
//! each call gets a CSI answer (a publish: OK, or ALREADY_EXISTS for a target another id holds; an
//! unpublish: OK, or NOT_FOUND for an id that no longer exists at a target another id holds), no target is
//! ever mounted twice nor handed to a second volume, and once everything is unpublished nothing is left.

use std::collections::HashMap;

use tonic::Code;

use crate::fixture::*;

const IDS: usize = 8;
const TARGETS: usize = 6;
const CALLS: usize = 2000;

fn id(i: usize) -> String {
    format!("csi-{i:064x}")
}

/// How many times `target` appears as a mount point in the mount table (more than once: stacked mounts).
fn mount_count(target: &str) -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(target))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_overlapping_calls_leave_a_consistent_node() {
    let f = Fixture::start().await;
    let targets: Vec<String> = (0..TARGETS)
        .map(|t| f.kubelet_path(&format!("pods/uid-{t}/volumes/kubernetes.io~csi/v/mount")))
        .collect();
    let mut tasks = Vec::new();
    for n in 0..CALLS {
        // A fixed, well-mixed pattern: each call picks an id, a target and publish or unpublish.
        let (i, t, publish) = ((n * 7) % IDS, (n * 5 + n / 3) % TARGETS, n % 3 != 0);
        let mut node = f.node.clone();
        let target = targets[t].clone();
        tasks.push(tokio::spawn(async move {
            let result = if publish {
                node.node_publish_volume(publish_ephemeral(&id(i), &target, &[]))
                    .await
                    .map(drop)
            } else {
                node.node_unpublish_volume(unpublish(&id(i), &target))
                    .await
                    .map(drop)
            };
            (publish, result.err().map(|s| s.code()))
        }));
    }
    let mut codes: HashMap<(bool, Option<Code>), usize> = HashMap::new();
    for task in tasks {
        *codes.entry(task.await.unwrap()).or_default() += 1;
    }
    let unexpected: Vec<_> = codes
        .iter()
        .filter(|((publish, code), _)| match publish {
            true => !matches!(code, None | Some(Code::AlreadyExists)),
            false => !matches!(code, None | Some(Code::NotFound)),
        })
        .collect();
    assert!(unexpected.is_empty(), "unexpected answers: {codes:?}");
    // Each target is held by at most one volume's record, and by one exactly when it is mounted.
    let records: Vec<serde_json::Value> = std::fs::read_dir(f.state_path("records/volumes"))
        .unwrap()
        .map(|e| serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
        .collect();
    for target in &targets {
        let holders = records
            .iter()
            .filter(|r| r["published"].get(target.as_str()).is_some())
            .count();
        assert!(holders <= 1, "{target} is published by {holders} volumes");
        assert_eq!(
            holders == 1,
            f.is_mounted(target),
            "{target}: {holders} holders"
        );
        if f.real_mounts() {
            assert!(
                mount_count(target) <= 1,
                "{target} is mounted {} times",
                mount_count(target)
            );
        }
    }
    // Unpublish every id at every target (NOT_FOUND only for an id already gone, at another's mount):
    // then the node is empty.
    let mut node = f.node.clone();
    for i in 0..IDS {
        for target in &targets {
            if let Err(s) = node.node_unpublish_volume(unpublish(&id(i), target)).await {
                assert_eq!(s.code(), Code::NotFound, "{}: {s:?}", id(i));
            }
        }
    }
    assert!(f.volume_contents().is_empty(), "{:?}", f.volume_contents());
    for target in &targets {
        assert!(!f.is_mounted(target), "{target} is still mounted");
        assert!(!std::path::Path::new(target).exists(), "{target} is left");
    }
    println!("answers: {codes:?}");
}
