//! What conform writes: the table on stdout (a row as each check ends), the JSON report, JUnit XML.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use inlet_proto::peer_text::safe;
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use super::ConformError;
use super::driver::DriverInfo;
use super::{CheckResult, ConformReport, Verdict};

/// The lines above the table: who the driver is and what it is tested with.
pub fn write_header(out: &mut impl Write, info: &DriverInfo) -> std::io::Result<()> {
    let list = |set: &std::collections::BTreeSet<String>| {
        if set.is_empty() {
            "none".to_string()
        } else {
            set.iter().cloned().collect::<Vec<_>>().join(", ")
        }
    };
    // The driver's name and version are its own words: escaped, as every text of the driver's here.
    writeln!(
        out,
        "driver      {} {}",
        safe(&info.name),
        safe(&info.vendor_version)
    )?;
    writeln!(out, "node        {}", list(&info.node_capabilities))?;
    writeln!(out, "controller  {}", list(&info.controller_capabilities))?;
    writeln!(
        out,
        "CSIDriver   {} (modes: {})",
        info.csi_driver_source,
        list(&info.modes())
    )?;
    writeln!(out)?;
    writeln!(out, "{:<6} {:<46} {:>8}  reason", "result", "check", "time")?;
    out.flush()
}

/// One row.
pub fn write_row(out: &mut impl Write, result: &CheckResult) -> std::io::Result<()> {
    let verdict = match result.result {
        Verdict::Pass => "pass",
        Verdict::Fail => "FAIL",
        Verdict::Skip => "skip",
    };
    writeln!(
        out,
        "{verdict:<6} {:<46} {:>7.2}s  {}",
        result.id,
        result.seconds,
        safe(&result.reason)
    )?;
    out.flush()
}

/// The counts below the table.
pub fn write_footer(out: &mut impl Write, report: &ConformReport) -> std::io::Result<()> {
    writeln!(
        out,
        "\n{} passed, {} failed, {} skipped",
        report.passed, report.failed, report.skipped
    )
}

/// Writes the JSON report to `path`.
pub fn write_json(report: &ConformReport, path: &Path) -> Result<(), ConformError> {
    let json =
        serde_json::to_vec_pretty(report).map_err(|e| ConformError::Output(e.to_string()))?;
    std::fs::write(path, json).map_err(ConformError::io(path.display()))
}

/// The report as JUnit XML: one test suite named after the driver, a test case per check (classname
/// its group), failures with their reason and the CSI calls as the failure's text.
pub fn junit(report: &ConformReport) -> Result<String, ConformError> {
    let mut suite = TestSuite::new(format!("kubelet-sim conform {}", report.driver.name));
    let mut total = Duration::ZERO;
    for result in &report.checks {
        let status = match result.result {
            Verdict::Pass => TestCaseStatus::success(),
            Verdict::Skip => {
                let mut status = TestCaseStatus::skipped();
                status.set_message(safe(&result.reason));
                status
            }
            Verdict::Fail => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                status.set_message(safe(&result.reason));
                let calls = serde_json::to_string_pretty(&result.csi_calls).unwrap_or_default();
                // XML 1.0 cannot carry most control characters: the calls' JSON escapes them.
                status.set_description(format!(
                    "expected: {}\nsource: {}\nCSI calls:\n{calls}",
                    result.expects, result.source
                ));
                status
            }
        };
        let (group, _) = result.id.split_once('/').unwrap_or(("", &result.id));
        let mut case = TestCase::new(result.id.clone(), status);
        let time = Duration::from_secs_f64(result.seconds);
        case.set_classname(group.to_string()).set_time(time);
        total += time;
        suite.add_test_case(case);
    }
    suite.set_time(total);
    let mut junit = Report::new("kubelet-sim conform");
    junit.set_time(total).add_test_suite(suite);
    junit
        .to_string()
        .map_err(|e| ConformError::Output(e.to_string()))
}

/// Writes the JUnit XML to `path`.
pub fn write_junit(report: &ConformReport, path: &Path) -> Result<(), ConformError> {
    std::fs::write(path, junit(report)?).map_err(ConformError::io(path.display()))
}
