//! SIGINT and SIGTERM for `kubelet-sim run`: the first asks for an orderly stop (the report is written and
//! what was mounted is torn down), a second exits at once. The exit status then says which signal it was
//! (128 + its number), as a shell reports a process killed by it.

use std::io;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// The first SIGINT or SIGTERM received, once one is.
#[derive(Debug, Clone)]
pub struct Interrupts {
    first: watch::Receiver<Option<Signal>>,
}

/// A signal that stops a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ctrl-C.
    Interrupt,
    /// `kill`, or a service manager stopping the run.
    Terminate,
}

impl Signal {
    /// The exit status a process stopped by this signal reports (128 + the signal's number).
    pub fn exit_status(self) -> u8 {
        match self {
            Self::Interrupt => 130,
            Self::Terminate => 143,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Interrupts {
    /// Starts listening (inside a tokio runtime). `on_second` runs, and the process exits with the second
    /// signal's status, when a second signal arrives.
    pub fn install(on_second: impl FnOnce(Signal) + Send + 'static) -> io::Result<Self> {
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let (tell, first) = watch::channel(None);
        tokio::spawn(async move {
            let next = async |interrupt: &mut tokio::signal::unix::Signal,
                              terminate: &mut tokio::signal::unix::Signal| {
                tokio::select! {
                    _ = interrupt.recv() => Signal::Interrupt,
                    _ = terminate.recv() => Signal::Terminate,
                }
            };
            let received = next(&mut interrupt, &mut terminate).await;
            eprintln!(
                "kubelet-sim: {received}: stopping, tearing down what was mounted (again to exit at once)"
            );
            let _ = tell.send(Some(received));
            let second = next(&mut interrupt, &mut terminate).await;
            on_second(second);
            std::process::exit(i32::from(second.exit_status()));
        });
        Ok(Self { first })
    }

    /// The first signal, if one came.
    pub fn received(&self) -> Option<Signal> {
        *self.first.borrow()
    }

    /// Waits for the first signal.
    pub async fn wait(&mut self) -> Signal {
        loop {
            if let Some(signal) = *self.first.borrow_and_update() {
                return signal;
            }
            if self.first.changed().await.is_err() {
                // The listener is gone: no signal will come.
                std::future::pending::<()>().await;
            }
        }
    }
}
