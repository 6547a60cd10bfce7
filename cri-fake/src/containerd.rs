//! A private containerd for tests and benchmarks: Debian's `containerd` with its own root, state and socket
//! in a directory, its CRI plugin pulling from the given local registries over plain HTTP, stopped (with
//! any containers it still runs) when dropped. What `../shared/reference/testbed.md` saw working here.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::registry::installed;

/// The binaries a private containerd needs to serve images (`runc` too to run containers).
pub const BINARIES: [&str; 2] = ["containerd", "ctr"];

/// How a private containerd is set up.
#[derive(Debug, Clone, Default)]
pub struct ContainerdOptions {
    /// The CRI plugin's sandbox (pause) image, when containers will run.
    pub sandbox_image: Option<String>,
    /// Registries (`HOST:PORT`) pulled from over plain HTTP.
    pub plain_http_registries: Vec<String>,
}

/// A running containerd.
#[derive(Debug)]
pub struct PrivateContainerd {
    child: Child,
    /// Its socket (CRI and containerd's own API).
    pub socket: PathBuf,
    /// Its root (content, snapshots, metadata).
    pub root: PathBuf,
    log: PathBuf,
}

impl PrivateContainerd {
    /// True when containerd and ctr are installed.
    pub fn available() -> bool {
        BINARIES.iter().all(|b| installed(b))
    }

    /// [`Self::start`] on the blocking pool, for callers on an async runtime: the wait for the socket
    /// sleeps, and may take seconds.
    pub async fn launch(dir: &Path, options: &ContainerdOptions) -> io::Result<Self> {
        let (dir, options) = (dir.to_path_buf(), options.clone());
        tokio::task::spawn_blocking(move || Self::start(&dir, &options))
            .await
            .map_err(io::Error::other)?
    }

    /// Stops containerd and what it runs on the blocking pool (what dropping it does, which waits), for
    /// callers on an async runtime.
    pub async fn stop(self) {
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }

    /// Starts containerd keeping everything in `dir`, and waits for its socket.
    pub fn start(dir: &Path, options: &ContainerdOptions) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("containerd.sock");
        let root = dir.join("root");
        let mut config = format!(
            "version = 2\nroot = \"{}\"\nstate = \"{}\"\n[grpc]\n  address = \"{}\"\n[debug]\n  level = \"warn\"\n",
            root.display(),
            dir.join("state").display(),
            socket.display(),
        );
        // restrict_oom_score_adj: this machine refuses the pause container's oom_score_adj. Sandboxes use
        // the node's network (no CNI here).
        config
            .push_str("[plugins.\"io.containerd.grpc.v1.cri\"]\n  restrict_oom_score_adj = true\n");
        if let Some(image) = &options.sandbox_image {
            config.push_str(&format!("  sandbox_image = \"{image}\"\n"));
        }
        config.push_str(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n",
        );
        for host in &options.plain_http_registries {
            config.push_str(&format!(
                "[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"{host}\"]\n  endpoint = [\"http://{host}\"]\n"
            ));
        }
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config)?;
        let log = dir.join("containerd.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config_path)
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()?;
        let mut containerd = Self {
            child,
            socket,
            root,
            log,
        };
        containerd.wait_ready()?;
        Ok(containerd)
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.socket.exists() {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "containerd exited with {status}: {}",
                    self.log()
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("containerd did not listen within 30 s: {}", self.log()),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// What containerd has logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `ctr` in CRI's namespace (`k8s.io`) against it; its stdout.
    pub fn ctr(&self, args: &[&str]) -> String {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        // Containers first (their shims outlive containerd), then containerd.
        for id in self.ctr(&["tasks", "ls", "-q"]).lines() {
            self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
            std::thread::sleep(Duration::from_millis(200));
            self.ctr(&["tasks", "delete", "--force", id]);
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
