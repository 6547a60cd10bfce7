//! concurrency/*: many pods at once, and pods with the same volume definition.

use super::*;

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
    let mut note = String::new();
    if env.conf.mounter.1 {
        let written = env.target("first", "data").join("conform-first");
        match std::fs::write(&written, b"first") {
            Ok(()) if env.target("second", "data").join("conform-first").exists() => {
                note = "the two volumes share their content (a shared driver, as e2e's `shared`)"
                    .into();
            }
            Ok(()) => {}
            Err(e) => note = format!("the volume is not writable ({e}): isolation not looked at"),
        }
    } else {
        note = "not root: isolation not looked at".into();
    }
    env.nothing_left(&[first.volume_id, second.volume_id])
        .await?;
    Ok(note)
}
