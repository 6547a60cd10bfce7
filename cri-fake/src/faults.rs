//! Fault injection: an error and/or a delay per CRI method, set at start (a YAML/JSON file or flags) or from
//! tests in-process. Modelled on the kubelet's own fakes (`FakeRuntimeService.InjectError`), but over gRPC.
//!
//! File form (method names as on the wire, without the service):
//! ```yaml
//! PullImage: {code: Unavailable, message: "registry is down", times: 2}
//! CreateContainer: {delay: 500ms}
//! ```

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use tonic::Code;

/// What happens to calls of one method.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The gRPC code to fail with (`Unavailable`, `NotFound`, ...). None: no error, only the delay.
    #[serde(default, deserialize_with = "de_code")]
    pub code: Option<Code>,
    /// The error message.
    #[serde(default)]
    pub message: String,
    /// Waited before answering (or failing).
    #[serde(default, deserialize_with = "de_duration")]
    pub delay: Option<Duration>,
    /// Only the first `times` calls are affected; None means every call.
    #[serde(default)]
    pub times: Option<u32>,
}

/// Faults by method name.
pub type Faults = HashMap<String, Fault>;

/// Reads a fault file (YAML or JSON, which is YAML too).
pub fn load(path: &std::path::Path) -> Result<Faults, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses `METHOD=CODE[:message]` (an error) as given to `--fault`.
pub fn parse_error_flag(flag: &str) -> Result<(String, Fault), String> {
    let (method, rest) = flag
        .split_once('=')
        .ok_or_else(|| format!("{flag:?}: expected METHOD=CODE[:message]"))?;
    let (code, message) = rest.split_once(':').unwrap_or((rest, "injected fault"));
    let code = parse_code(code)?;
    Ok((
        method.to_string(),
        Fault {
            code: Some(code),
            message: message.to_string(),
            ..Default::default()
        },
    ))
}

/// Parses `METHOD=DURATION` as given to `--delay`.
pub fn parse_delay_flag(flag: &str) -> Result<(String, Duration), String> {
    let (method, delay) = flag
        .split_once('=')
        .ok_or_else(|| format!("{flag:?}: expected METHOD=DURATION"))?;
    let delay = humantime::parse_duration(delay).map_err(|e| format!("{flag:?}: {e}"))?;
    Ok((method.to_string(), delay))
}

/// A gRPC code by its name, in any case, with or without underscores (`NOT_FOUND`, `NotFound`, `not_found`).
pub fn parse_code(name: &str) -> Result<Code, String> {
    let key: String = name
        .chars()
        .filter(|c| *c != '_')
        .collect::<String>()
        .to_ascii_lowercase();
    let code = match key.as_str() {
        "cancelled" => Code::Cancelled,
        "unknown" => Code::Unknown,
        "invalidargument" => Code::InvalidArgument,
        "deadlineexceeded" => Code::DeadlineExceeded,
        "notfound" => Code::NotFound,
        "alreadyexists" => Code::AlreadyExists,
        "permissiondenied" => Code::PermissionDenied,
        "resourceexhausted" => Code::ResourceExhausted,
        "failedprecondition" => Code::FailedPrecondition,
        "aborted" => Code::Aborted,
        "outofrange" => Code::OutOfRange,
        "unimplemented" => Code::Unimplemented,
        "internal" => Code::Internal,
        "unavailable" => Code::Unavailable,
        "dataloss" => Code::DataLoss,
        "unauthenticated" => Code::Unauthenticated,
        _ => return Err(format!("unknown gRPC code {name:?}")),
    };
    Ok(code)
}

fn de_code<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Code>, D::Error> {
    let name: Option<String> = Option::deserialize(d)?;
    name.map(|n| parse_code(&n).map_err(serde::de::Error::custom))
        .transpose()
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("faults.yaml");
        std::fs::write(&file, "PullImage: {code: Unavailable, message: down, times: 2}\nCreateContainer: {delay: 500ms}\n").unwrap();
        let faults = load(&file).unwrap();
        assert_eq!(faults["PullImage"].code, Some(Code::Unavailable));
        assert_eq!(faults["PullImage"].times, Some(2));
        assert_eq!(
            faults["CreateContainer"].delay,
            Some(Duration::from_millis(500))
        );
        std::fs::write(&file, "PullImage: {code: Sideways}\n").unwrap();
        assert!(load(&file).unwrap_err().contains("Sideways"));
        std::fs::write(&file, "PullImage: {colour: red}\n").unwrap();
        assert!(load(&file).is_err(), "unknown keys are refused");

        assert_eq!(
            parse_error_flag("RunPodSandbox=NOT_FOUND:gone")
                .unwrap()
                .1
                .code,
            Some(Code::NotFound)
        );
        assert!(parse_error_flag("RunPodSandbox").is_err());
        assert_eq!(
            parse_delay_flag("PullImage=2s").unwrap().1,
            Duration::from_secs(2)
        );
        assert!(parse_delay_flag("PullImage=soon").is_err());
    }
}
