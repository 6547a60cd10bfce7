//! What a container "runs": cri-fake starts no process, but it understands a few small programs, so a
//! scenario's pod can end. `true`, `false`, `sleep N`, and `sh -c` scripts of `;`- or `&&`-joined
//! commands among `exit N`, `true`, `false`, `sleep N`, `echo ...`, `cat PATH` and `test -e|-f|-d PATH`
//! (also `[ ... ]`). Paths are read through the container's mounts, so a command can check a volume's
//! file; `$NAME` and `${NAME}` are the container's environment variables, as a shell expands them. Anything
//! else runs until stopped, as before.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inlet_proto::runtime::v1 as cri;

/// A container's mount as its programs read it: a host dir, or an image's layers stacked as an overlay
/// would stack them (KEP-4639's `Mount.image`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where the container sees it.
    pub container_path: String,
    /// The dirs it shows, top first: a path is read from the first that has it, unless a layer above
    /// whites it out.
    pub layers: Vec<PathBuf>,
    /// An image's layers: a symlink in them is not followed (it would resolve on the host, outside the
    /// image; a runtime resolves it inside the image's root, which this fake does not model).
    pub image: bool,
}

impl From<&cri::Mount> for Mount {
    fn from(mount: &cri::Mount) -> Self {
        Self {
            container_path: mount.container_path.clone(),
            layers: match mount.host_path.is_empty() {
                true => Vec::new(),
                false => vec![PathBuf::from(&mount.host_path)],
            },
            image: false,
        }
    }
}

impl Mount {
    /// Where `rest` (a relative path below the mount) is on the host: in the topmost layer that has it.
    /// An OCI whiteout (`.wh.NAME`, or overlay's 0:0 character device) of it or of a dir above it hides
    /// it in every layer below; in an image, a symlink on the way hides it too.
    pub fn find(&self, rest: &Path) -> Option<PathBuf> {
        for layer in &self.layers {
            match self.walk(layer, rest) {
                Walk::Found(path) => return Some(path),
                Walk::Hidden => return None,
                Walk::Missing => {}
            }
        }
        None
    }

    /// `rest` in one layer, component by component, without following a symlink in an image.
    fn walk(&self, layer: &Path, rest: &Path) -> Walk {
        let mut path = layer.to_path_buf();
        for component in rest.components() {
            let mut whiteout = std::ffi::OsString::from(".wh.");
            whiteout.push(component.as_os_str());
            if std::fs::symlink_metadata(path.join(whiteout)).is_ok() {
                return Walk::Hidden;
            }
            path.push(component);
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                return Walk::Missing;
            };
            let overlay_whiteout = meta.file_type().is_char_device()
                && std::os::unix::fs::MetadataExt::rdev(&meta) == 0;
            if overlay_whiteout || (self.image && meta.file_type().is_symlink()) {
                return Walk::Hidden;
            }
        }
        Walk::Found(path)
    }
}

/// What one layer has at a path.
enum Walk {
    Found(PathBuf),
    Missing,
    Hidden,
}

/// How a started container ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It runs until stopped (an unknown program, or none).
    RunsUntilStopped,
    /// It exits with `code` after `after`, having written `output` (stdout lines) to its log.
    Exits {
        /// Its exit code.
        code: i32,
        /// How long it runs.
        after: Duration,
        /// What it printed, line by line.
        output: Vec<String>,
    },
}

/// The outcome of running `command` + `args` with `mounts` and the environment `envs`.
pub fn run(
    command: &[String],
    args: &[String],
    mounts: &[Mount],
    envs: &[cri::KeyValue],
) -> Outcome {
    let argv: Vec<&str> = command.iter().chain(args).map(String::as_str).collect();
    let mut script = Script {
        mounts,
        envs,
        after: Duration::ZERO,
        output: Vec::new(),
    };
    let code = match argv.as_slice() {
        [sh, "-c", text, ..] if is_shell(sh) => script.run(text),
        [] => None,
        words => script.command(words).map(|status| match status {
            Status::Exit(code) | Status::Done(code) => code,
        }),
    };
    match code {
        Some(code) => Outcome::Exits {
            code,
            after: script.after,
            output: script.output,
        },
        None => Outcome::RunsUntilStopped,
    }
}

fn is_shell(word: &str) -> bool {
    matches!(word, "sh" | "/bin/sh" | "bash" | "/bin/bash")
}

/// A command's effect on the script: the script ends (`exit`), or goes on with the command's status.
enum Status {
    Exit(i32),
    Done(i32),
}

struct Script<'a> {
    mounts: &'a [Mount],
    envs: &'a [cri::KeyValue],
    after: Duration,
    output: Vec<String>,
}

impl Script<'_> {
    /// The script's exit code; None when a command is not understood (it runs until stopped).
    fn run(&mut self, text: &str) -> Option<i32> {
        let mut last = 0;
        for statement in text.split([';', '\n']) {
            for (i, command) in statement.split("&&").enumerate() {
                if i > 0 && last != 0 {
                    break;
                }
                let words = split_words(&self.expand(command)?)?;
                if words.is_empty() {
                    continue;
                }
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
                match self.command(&words)? {
                    Status::Exit(code) => return Some(code),
                    Status::Done(code) => last = code,
                }
            }
        }
        Some(last)
    }

    /// `$NAME` and `${NAME}` replaced by the variable's value (empty when unset), as sh does outside
    /// single quotes; None (not understood) for any other `$` use, such as `$(cmd)` or `$1`.
    fn expand(&self, text: &str) -> Option<String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        let mut quoted = false;
        while let Some(c) = rest.chars().next() {
            rest = &rest[c.len_utf8()..];
            if c == '\'' {
                quoted = !quoted;
            }
            if c != '$' || quoted {
                out.push(c);
                continue;
            }
            let (name, after) = match rest.strip_prefix('{') {
                Some(body) => {
                    let end = body.find('}')?;
                    (&body[..end], &body[end + 1..])
                }
                None => {
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    (&rest[..end], &rest[end..])
                }
            };
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                return None;
            }
            let value = self.envs.iter().find(|kv| kv.key == name);
            out.push_str(value.map(|kv| kv.value.as_str()).unwrap_or_default());
            rest = after;
        }
        Some(out)
    }

    fn command(&mut self, words: &[&str]) -> Option<Status> {
        Some(match words {
            ["exit"] => Status::Exit(0),
            ["exit", code] => Status::Exit(code.parse().ok()?),
            ["true"] | [":"] => Status::Done(0),
            ["false"] => Status::Done(1),
            ["sleep", "infinity"] => return None,
            ["sleep", seconds] => {
                self.after += Duration::try_from_secs_f64(seconds.parse().ok()?).ok()?;
                Status::Done(0)
            }
            ["echo", rest @ ..] => {
                self.output.push(rest.join(" "));
                Status::Done(0)
            }
            ["cat", paths @ ..] if !paths.is_empty() => {
                let mut code = 0;
                for path in paths {
                    match self.host_path(path).map(std::fs::read_to_string) {
                        Some(Ok(text)) => self.output.extend(text.lines().map(String::from)),
                        _ => code = 1,
                    }
                }
                Status::Done(code)
            }
            ["test", flag, path] | ["[", flag, path, "]"] => {
                let meta = self.host_path(path).and_then(|p| std::fs::metadata(p).ok());
                let holds = match *flag {
                    "-e" => meta.is_some(),
                    "-f" => meta.is_some_and(|m| m.is_file()),
                    "-d" => meta.is_some_and(|m| m.is_dir()),
                    _ => return None,
                };
                Status::Done(if holds { 0 } else { 1 })
            }
            _ => return None,
        })
    }

    /// Where a container path is on the host: under the mount whose container path is its longest
    /// prefix. None outside every mount (the image's own files are not kept) or when it would leave it.
    fn host_path(&self, path: &str) -> Option<PathBuf> {
        let path = std::path::Path::new(path);
        let mount = self
            .mounts
            .iter()
            .filter(|m| !m.layers.is_empty() && path.starts_with(&m.container_path))
            .max_by_key(|m| m.container_path.len())?;
        let rest = path.strip_prefix(&mount.container_path).ok()?;
        if rest
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return None;
        }
        mount.find(rest)
    }
}

/// Shell words with single and double quotes; None for what this small shell does not read (`$`,
/// redirections, pipes, backquotes).
fn split_words(text: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '$' | '>' | '<' | '|' | '`' | '(' | ')') => return None,
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    if quote.is_some() {
        return None;
    }
    words.extend(word);
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    fn exits(code: i32, after: Duration, output: &[&str]) -> Outcome {
        Outcome::Exits {
            code,
            after,
            output: argv(output),
        }
    }

    #[test]
    fn small_programs_end() {
        assert_eq!(
            run(&argv(&["true"]), &[], &[], &[]),
            exits(0, Duration::ZERO, &[])
        );
        assert_eq!(
            run(&argv(&["false"]), &[], &[], &[]),
            exits(1, Duration::ZERO, &[])
        );
        assert_eq!(
            run(&argv(&["sleep"]), &argv(&["0.5"]), &[], &[]),
            exits(0, Duration::from_millis(500), &[])
        );
        assert_eq!(
            run(
                &argv(&["sh", "-c", "echo 'hello there'; exit 3"]),
                &[],
                &[],
                &[]
            ),
            exits(3, Duration::ZERO, &["hello there"])
        );
        assert_eq!(
            run(
                &argv(&["/bin/sh", "-c"]),
                &argv(&["false && echo no; true"]),
                &[],
                &[]
            ),
            exits(0, Duration::ZERO, &[])
        );
    }

    #[test]
    fn variables_are_the_containers_environment() {
        let envs = [cri::KeyValue {
            key: "GREETING".into(),
            value: "hello".into(),
        }];
        assert_eq!(
            run(
                &argv(&[
                    "sh",
                    "-c",
                    "echo $GREETING ${GREETING}-x '$GREETING' [$UNSET]"
                ]),
                &[],
                &[],
                &envs
            ),
            exits(0, Duration::ZERO, &["hello hello-x $GREETING []"])
        );
    }

    #[test]
    fn others_run_until_stopped() {
        for words in [
            &["sleep", "infinity"][..],
            &["nginx"],
            &["sh", "-c", "echo $(date)"],
            &["sh", "-c", "echo $1"],
            &["sh", "-c", "cat /x | grep y"],
            &[],
        ] {
            assert_eq!(
                run(&argv(words), &[], &[], &[]),
                Outcome::RunsUntilStopped,
                "{words:?}"
            );
        }
    }

    #[test]
    fn files_are_read_through_the_mounts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "hi\n").unwrap();
        let mounts = [Mount::from(&cri::Mount {
            container_path: "/data".into(),
            host_path: dir.path().display().to_string(),
            ..Default::default()
        })];
        let script = |text: &str| run(&argv(&["sh", "-c", text]), &[], &mounts, &[]);
        assert_eq!(
            script("test -f /data/index.html && cat /data/index.html"),
            exits(0, Duration::ZERO, &["hi"])
        );
        assert_eq!(
            script("[ -f /data/missing ]"),
            exits(1, Duration::ZERO, &[])
        );
        assert_eq!(
            script("cat /data/../etc/passwd"),
            exits(1, Duration::ZERO, &[]),
            "never outside the mount"
        );
        assert_eq!(script("cat /etc/hostname"), exits(1, Duration::ZERO, &[]));
    }

    #[test]
    fn an_image_mount_reads_its_layers_top_first_with_whiteouts() {
        let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for (dir, name, text) in [
            (&lower, "a", "lower"),
            (&lower, "b", "lower"),
            (&lower, "c", "lower"),
            (&upper, "a", "upper"),
            (&upper, ".wh.b", ""),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        std::os::unix::fs::symlink("/etc", upper.path().join("escape")).unwrap();
        let mounts = [Mount {
            container_path: "/img".into(),
            layers: vec![upper.path().into(), lower.path().into()],
            image: true,
        }];
        let script = |text: &str| run(&argv(&["sh", "-c", text]), &[], &mounts, &[]);
        assert_eq!(
            script("cat /img/a /img/c"),
            exits(0, Duration::ZERO, &["upper", "lower"])
        );
        assert_eq!(script("test -e /img/b"), exits(1, Duration::ZERO, &[]));
        assert_eq!(
            script("cat /img/escape/hostname"),
            exits(1, Duration::ZERO, &[]),
            "a symlink in an image never leads to the host"
        );
    }
}
