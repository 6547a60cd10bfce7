//! Steps about container lifecycle hooks: what the runtime was asked to run, and when.

use std::sync::Arc;
use std::time::Duration;

use cucumber::{given, then};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::Sim;

/// An HTTP server on 127.0.0.1 that answers 200 to every request and keeps each request's lines
/// (request line, then headers); `HTTP_PORT` in the manifests given so far becomes its port.
#[given(regex = r"^an HTTP server on 127.0.0.1 that records its requests$")]
async fn http_server(w: &mut Sim) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    for manifest in &mut w.manifests {
        *manifest = manifest.replace("HTTP_PORT", &port);
    }
    let requests = Arc::clone(&w.http_requests);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let requests = Arc::clone(&requests);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let mut request = Vec::new();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.is_empty() {
                        break;
                    }
                    request.push(line);
                }
                requests.lock().push(request.join("\n"));
                let _ = write
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
}

#[then(regex = r#"^the HTTP server got "([^"]+)" with the header "([^"]+)"$"#)]
async fn http_request(w: &mut Sim, request_line: String, header: String) {
    for _ in 0..100 {
        let got = w.http_requests.lock().clone();
        if got
            .iter()
            .any(|r| r.starts_with(&request_line) && r.lines().any(|l| l == header))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no {request_line:?} with {header:?}: {:#?}",
        w.http_requests.lock()
    );
}

/// The runtime's calls, in order, as (method, subject).
fn calls(w: &Sim) -> Vec<(String, String)> {
    w.sim()
        .cri_fakes()
        .flat_map(|(_, runtime)| runtime.calls())
        .map(|c| (c.method.to_string(), c.subject.into()))
        .collect()
}

#[then(regex = r"^the runtime ran a preStop hook in a container before stopping it$")]
fn hook_before_stop(w: &mut Sim) {
    let calls = calls(w);
    let exec = calls
        .iter()
        .position(|(method, _)| method == "ExecSync")
        .unwrap_or_else(|| panic!("no ExecSync: {calls:#?}"));
    let container = &calls[exec].1;
    let stop = calls
        .iter()
        .position(|(method, subject)| method == "StopContainer" && subject == container)
        .unwrap_or_else(|| panic!("container {container} was not stopped: {calls:#?}"));
    assert!(exec < stop, "the hook ran after the stop: {calls:#?}");
}

#[then(regex = r"^the runtime ran no hook$")]
fn no_hook(w: &mut Sim) {
    let calls = calls(w);
    assert!(
        !calls.iter().any(|(method, _)| method == "ExecSync"),
        "{calls:#?}"
    );
}
