//! The kit (`../shared/kit`: etcd, kube-apiserver, controller-manager, scheduler and a real kubelet v1.20.2
//! on containerd or CRI-O) for tests: found through `$INLET_KIT` (default `../shared/kit` beside the
//! workspace), brought up under a `KIT_RUN` of the test's own and taken down on drop, whatever happens.
//! The kit's addresses are fixed, so one test process runs one kit at a time: [`Kit::up`] waits for the
//! previous one to be down.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Held by the kit that is up in this process.
static TURN: Mutex<()> = Mutex::new(());

/// The workspace's root: the nearest directory above this test's crate that holds `Cargo.lock`.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").exists())
        .unwrap_or(manifest)
        .to_path_buf()
}

/// The kit's directory, when it is there.
pub fn find() -> Option<PathBuf> {
    let kit = std::env::var_os("INLET_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/kit"));
    kit.join("up.sh").exists().then_some(kit)
}

/// One of the kit's binaries (`bin/<name>.xz`) unpacked into `dir`, when the kit is there: for tests that
/// need the binary (kubectl, csi-sanity) but not the cluster.
pub fn unpack(name: &str, dir: &Path) -> Option<PathBuf> {
    let packed = find()?.join("bin").join(format!("{name}.xz"));
    let binary = dir.join(name);
    let out = std::fs::File::create(&binary).ok()?;
    let status = Command::new("xz")
        .arg("-dc")
        .arg(&packed)
        .stdout(out)
        .status()
        .ok()?;
    if !status.success() {
        return None;
    }
    std::fs::set_permissions(&binary, std::os::unix::fs::PermissionsExt::from_mode(0o755)).ok()?;
    Some(binary)
}

/// Why the kit cannot run here, if it cannot: it needs root, its directory, and its ports free.
pub fn missing() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("not root".into());
    }
    if find().is_none() {
        return Some("the kit is missing (set INLET_KIT)".into());
    }
    if std::net::TcpStream::connect("127.0.0.1:16443").is_ok() {
        return Some("a kit is already running here (port 16443); take it down first".into());
    }
    None
}

/// The ports the kit's processes listen on (its up.sh: etcd's client and peer ports, the API server's,
/// the kubelet's and its healthz, the controller manager's and the scheduler's).
const KIT_PORTS: [u16; 7] = [23790, 23800, 16443, 20250, 20248, 20257, 20259];

/// The kit, up under `run`; taken down (its pods, registrations, mounts and the processes whose pid files
/// are in `run/pids/`) on drop.
pub struct Kit {
    dir: PathBuf,
    /// The kit's `KIT_RUN`.
    pub run: PathBuf,
    /// Processes the test started beside the kit (killed on drop, after down.sh).
    children: Vec<Child>,
    /// This process's one kit: released after down.sh.
    _turn: MutexGuard<'static, ()>,
}

impl Kit {
    /// Brings the kit up on `runtime` (`containerd` or `crio`).
    pub fn up(dir: &Path, run: &Path, runtime: &str) -> Self {
        Self::up_with(dir, run, runtime, &[])
    }

    /// Brings up only the runtime (`KIT_RUNTIME_ONLY=1`: no API server, no kubelet), for a kubelet-sim
    /// that owns the runtime's pods (`--cri`).
    pub fn up_runtime_only(dir: &Path, run: &Path, runtime: &str) -> Self {
        Self::up_with(dir, run, runtime, &[("KIT_RUNTIME_ONLY", "1")])
    }

    /// Brings the kit up with options (`KIT_BOUND_TOKENS=1`, ...; see the kit's README).
    pub fn up_with(dir: &Path, run: &Path, runtime: &str, options: &[(&str, &str)]) -> Self {
        // A test that panicked with the kit up has taken it down on drop: the lock is free to take.
        let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let kit = Self {
            dir: dir.to_path_buf(),
            run: run.to_path_buf(),
            children: Vec::new(),
            _turn: turn,
        };
        // down.sh waits for the processes it started; one still closing (an etcd of the kit before, seen
        // once here) may hold its port a moment longer, and up.sh then fails to start it.
        wait(
            "the kit's ports to be free",
            Duration::from_secs(30),
            || {
                KIT_PORTS
                    .iter()
                    .all(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
            },
        );
        let out = kit.script_with("up.sh", &[runtime], options);
        assert!(
            out.status.success(),
            "up.sh {runtime} failed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        kit
    }

    fn script(&self, name: &str, args: &[&str]) -> std::process::Output {
        self.script_with(name, args, &[])
    }

    fn script_with(
        &self,
        name: &str,
        args: &[&str],
        options: &[(&str, &str)],
    ) -> std::process::Output {
        Command::new(self.dir.join(name))
            .args(args)
            .envs(options.iter().copied())
            .env("KIT_RUN", &self.run)
            .stdin(Stdio::null())
            .output()
            .expect("the kit's script runs")
    }

    /// The kubelet's root dir.
    pub fn kubelet_dir(&self) -> PathBuf {
        self.run.join("run/kubelet")
    }

    /// The kubelet's plugin registration dir.
    pub fn plugins_registry(&self) -> PathBuf {
        self.kubelet_dir().join("plugins_registry")
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.run.join("run/kubeconfig/admin.kubeconfig")
    }

    /// A kubeconfig in `dir` for the node `node` with its own credential, as the kit makes its kubelet's:
    /// a client certificate for `system:node:<node>` in `system:nodes`, signed by the kit's CA.
    pub fn node_kubeconfig(&self, dir: &Path, node: &str) -> PathBuf {
        let pki = self.run.join("run/pki");
        let (key, csr, crt) = (
            dir.join(format!("{node}.key")),
            dir.join(format!("{node}.csr")),
            dir.join(format!("{node}.crt")),
        );
        let ext = dir.join(format!("{node}.ext"));
        std::fs::write(
            &ext,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        let subject = format!("/O=system:nodes/CN=system:node:{node}");
        let openssl = |args: &[&std::ffi::OsStr]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req".as_ref(),
            "-newkey".as_ref(),
            "rsa:2048".as_ref(),
            "-nodes".as_ref(),
            "-keyout".as_ref(),
            key.as_os_str(),
            "-out".as_ref(),
            csr.as_os_str(),
            "-subj".as_ref(),
            subject.as_ref(),
        ]);
        openssl(&[
            "x509".as_ref(),
            "-req".as_ref(),
            "-in".as_ref(),
            csr.as_os_str(),
            "-CA".as_ref(),
            pki.join("ca.crt").as_os_str(),
            "-CAkey".as_ref(),
            pki.join("ca.key").as_os_str(),
            "-CAcreateserial".as_ref(),
            "-out".as_ref(),
            crt.as_os_str(),
            "-days".as_ref(),
            "1".as_ref(),
            "-extfile".as_ref(),
            ext.as_os_str(),
        ]);
        let kubeconfig = dir.join(format!("{node}.kubeconfig"));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: kit\n  cluster: {{server: \"https://127.0.0.1:16443\", certificate-authority: \"{}\"}}\nusers:\n- name: node\n  user: {{client-certificate: \"{}\", client-key: \"{}\"}}\ncontexts:\n- name: kit\n  context: {{cluster: kit, user: node}}\ncurrent-context: kit\n",
                pki.join("ca.crt").display(),
                crt.display(),
                key.display()
            ),
        )
        .unwrap();
        kubeconfig
    }

    /// The runtime's CRI endpoint (`unix:///...`).
    pub fn cri_endpoint(&self) -> String {
        std::fs::read_to_string(self.run.join("run/cri-endpoint"))
            .expect("run/cri-endpoint")
            .trim()
            .to_string()
    }

    /// A kit binary (kubectl, crictl, csi-node-driver-registrar, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.run.join("bin").join(name)
    }

    /// Runs kubectl; panics with its stderr when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.try_kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl.
    pub fn try_kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new(self.bin("kubectl"))
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .output()
            .expect("kubectl runs")
    }

    /// Applies a manifest given as text.
    pub fn apply(&self, name: &str, manifest: &str) {
        let path = self.run.join(format!("{name}.yaml"));
        std::fs::write(&path, manifest).expect("manifest");
        self.kubectl(&["apply", "-f", path.to_str().expect("path")]);
    }

    /// The CSI drivers in the node's CSINode.
    pub fn drivers_in_csinode(&self) -> String {
        self.kubectl(&[
            "get",
            "csinode",
            "-o",
            "jsonpath={.items[*].spec.drivers[*].name}",
        ])
    }

    /// A pod's phase.
    pub fn phase(&self, pod: &str) -> String {
        self.kubectl(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"])
    }

    /// A pod's UID.
    pub fn uid(&self, pod: &str) -> String {
        self.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"])
    }

    /// Starts a process beside the kit, logging to `run/logs/<name>.log`; its pid file makes down.sh stop
    /// it too. Returns its index for [`Kit::stop`].
    pub fn start(&mut self, name: &str, command: &mut Command) -> usize {
        let log =
            std::fs::File::create(self.run.join(format!("run/logs/{name}.log"))).expect("log");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        std::fs::write(
            self.run.join(format!("run/pids/{name}.pid")),
            child.id().to_string(),
        )
        .expect("pid");
        self.children.push(child);
        self.children.len() - 1
    }

    /// What a process started with [`Kit::start`] logged.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.run.join(format!("run/logs/{name}.log"))).unwrap_or_default()
    }

    /// Stops a process started with [`Kit::start`] with SIGTERM, as a pod's deletion would, and waits.
    pub fn stop(&mut self, index: usize) -> std::process::ExitStatus {
        let child = &mut self.children[index];
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        child.wait().expect("wait")
    }
}

impl Drop for Kit {
    fn drop(&mut self) {
        let out = self.script("down.sh", &[]);
        if !out.status.success() {
            eprintln!("down.sh: {}", String::from_utf8_lossy(&out.stdout));
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `done`, or panics after `timeout` naming `what`.
pub fn wait(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Creates a volume of 16 MiB named `name` on the CSI driver at `socket` (CreateVolume, mount access,
/// single-node writer), as an administrator does before writing a static PV for it.
pub async fn create_volume(socket: &Path, name: &str) {
    use inlet_proto::csi::v1::volume_capability::AccessType;
    create(socket, name, AccessType::Mount(Default::default())).await
}

/// As [`create_volume`], with block access: the volume behind a `volumeMode: Block` PV.
pub async fn create_block_volume(socket: &Path, name: &str) {
    use inlet_proto::csi::v1::volume_capability::AccessType;
    create(socket, name, AccessType::Block(Default::default())).await
}

async fn create(
    socket: &Path,
    name: &str,
    access_type: inlet_proto::csi::v1::volume_capability::AccessType,
) {
    use inlet_proto::csi::v1 as csi;
    let channel = inlet_proto::uds::connect(socket).await.expect("connect");
    let request = csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(access_type),
        }],
        ..Default::default()
    };
    csi::controller_client::ControllerClient::new(channel)
        .create_volume(request)
        .await
        .expect("CreateVolume");
}

/// Stops a driver process as its pod's deletion would: SIGTERM, so it undoes what it set up (its content
/// dir's self-bind), then SIGKILL if it has not exited within 10 s. A process already gone is reaped.
pub fn terminate(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}
