//! A private OCI registry for tests and demos: Debian's `docker-registry` (the CNCF distribution registry)
//! started in a directory of its own on a free local port, optionally behind HTTP basic auth, and stopped
//! when dropped.

use std::io;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The registry binary's name.
pub const BINARY: &str = "docker-registry";

/// True when `binary` is a file in a `$PATH` directory (what tests check before using a Debian tool).
pub fn installed(binary: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(binary).is_file()))
}

/// A running registry.
#[derive(Debug)]
pub struct LocalRegistry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub address: String,
}

impl LocalRegistry {
    /// True when the registry binary is installed.
    pub fn available() -> bool {
        installed(BINARY)
    }

    /// Starts a registry keeping its data and config in `dir`; with `basic_auth`, every request needs that
    /// user and password.
    pub fn start(dir: &Path, basic_auth: Option<(&str, &str)>) -> io::Result<Self> {
        std::fs::create_dir_all(dir.join("data"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let address = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}\n",
            dir.join("data").display()
        );
        if let Some((user, password)) = basic_auth {
            let hash = bcrypt::hash(password, 4).map_err(io::Error::other)?;
            std::fs::write(dir.join("htpasswd"), format!("{user}:{hash}\n"))?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: inlet-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        let config_path = dir.join("config.yml");
        std::fs::write(&config_path, config)?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(&config_path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()?;
        let mut registry = Self { child, address };
        registry.wait_ready(dir)?;
        Ok(registry)
    }

    fn wait_ready(&mut self, dir: &Path) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                let log = std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "{BINARY} exited with {status}: {log}"
                )));
            }
            if std::net::TcpStream::connect(&self.address).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{BINARY} did not listen on {} within 15 s", self.address),
        ))
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
