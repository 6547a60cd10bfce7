//! concurrency/*: many pods at once, and pods with the same volume definition.

use super::*;

/// The concurrency/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "concurrency/many-pods",
            expects: "ten pods with two inline volumes each, created and deleted at once on one node, all \
                  run with twenty distinct volumes and leave nothing",
            source: "e2e testsuites/ephemeral.go \"should support multiple inline ephemeral volumes\"; \
                 operation_executor.go (operations on different volumes run in parallel)",
            applies: |c| ephemeral(c).and(needs_read_write(c, 2)),
            run: |env| Box::pin(concurrency::many_pods(env)),
        },
        Check {
            id: "concurrency/same-definition",
            expects: "two pods with the same inline volume definition get two volume ids and both run; as \
                  root, a file one writes does not show in the other unless the definition is declared \
                  Shared (or ReadOnly) in --testdriver",
            source: "e2e testsuites/ephemeral.go \"should support two pods which have the same volume \
                 definition\" (isolation unless the driver is `shared`); KEP-596 Design 2 (a handle per \
                 pod); storage/v1 VolumeLifecycleEphemeral (reference counting of identical volumes)",
            applies: |c| ephemeral(c).and(needs_read_write(c, 1)),
            run: |env| Box::pin(concurrency::same_definition(env)),
        },
    ]
}

pub(super) async fn many_pods(env: &mut CheckEnv) -> Outcome {
    let names: Vec<String> = (1..=10).map(|i| format!("many-{i}")).collect();
    let volumes = [InlineVolume::named("one"), InlineVolume::named("two")];
    let pods = names
        .iter()
        .map(|n| env.pod(n, &volumes, json!({})))
        .collect();
    env.run_pods(pods).await?;
    let mut ids = BTreeSet::new();
    for name in &names {
        for volume in ["one", "two"] {
            ids.insert(env.published(name, volume)?.volume_id);
        }
    }
    if ids.len() != 20 {
        return Err(format!("20 volumes got {} distinct volume ids", ids.len()));
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    env.delete(&refs).await?;
    env.nothing_left(&ids.into_iter().collect::<Vec<_>>())
        .await?;
    Ok(deletion_note(env))
}

pub(super) async fn same_definition(env: &mut CheckEnv) -> Outcome {
    let volume = [InlineVolume::named("data")];
    let pods = vec![
        env.pod("first", &volume, json!({})),
        env.pod("second", &volume, json!({})),
    ];
    env.run_pods(pods).await?;
    let (first, second) = (
        env.published("first", "data")?,
        env.published("second", "data")?,
    );
    if first.volume_id == second.volume_id {
        return Err(format!("both pods got volume id {}", first.volume_id));
    }
    // e2e looks at the data only for a definition neither shared nor read-only.
    let definition = env.conf.inline(0);
    let note = match (definition.shared, definition.read_only, env.conf.mounter.1) {
        (true, _, _) => "the definition is Shared: isolation not looked at".to_string(),
        (_, true, _) => "the definition is ReadOnly: isolation not looked at".to_string(),
        (_, _, false) => "not root: isolation not looked at".to_string(),
        _ => {
            let written = env.volume_dir("first", "data").await.join("hello-world");
            std::fs::write(&written, b"first")
                .map_err(|e| format!("writing in the first pod's volume: {e}"))?;
            if env
                .volume_dir("second", "data")
                .await
                .join("hello-world")
                .exists()
            {
                return Err(
                    "a file the first pod wrote shows in the second pod's volume: the \
                            definition must be declared Shared (--testdriver, InlineVolumes[0])"
                        .into(),
                );
            }
            String::new()
        }
    };
    env.nothing_left(&[first.volume_id, second.volume_id])
        .await?;
    Ok(note)
}
