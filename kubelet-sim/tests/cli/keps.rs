//! The KEPs under `kep/` as an approver checks them: each in a directory of its own with a `kep.yaml`
//! holding every field of kubernetes/enhancements' template and `status: provisional`, and a README with
//! every section of `keps/NNNN-kep-template/README.md`, each with content of its own and none "TBD";
//! `kep/README.md` links every document, and every relative link in them resolves.

use std::path::{Path, PathBuf};

/// The template's sections, in its order (`(Optional)` dropped from the titles).
const SECTIONS: [&str; 27] = [
    "Release Signoff Checklist",
    "Summary",
    "Motivation",
    "Goals",
    "Non-Goals",
    "Proposal",
    "User Stories",
    "Notes/Constraints/Caveats",
    "Risks and Mitigations",
    "Design Details",
    "Test Plan",
    "Prerequisite testing updates",
    "Unit tests",
    "Integration tests",
    "e2e tests",
    "Graduation Criteria",
    "Upgrade / Downgrade Strategy",
    "Version Skew Strategy",
    "Production Readiness Review Questionnaire",
    "Feature Enablement and Rollback",
    "Rollout, Upgrade and Rollback Planning",
    "Monitoring Requirements",
    "Dependencies",
    "Scalability",
    "Troubleshooting",
    "Implementation History",
    "Drawbacks",
];
/// `kep.yaml`'s fields.
const FIELDS: [&str; 15] = [
    "title",
    "kep-number",
    "authors",
    "owning-sig",
    "participating-sigs",
    "status",
    "creation-date",
    "reviewers",
    "approvers",
    "stage",
    "latest-milestone",
    "milestone",
    "feature-gates",
    "disable-supported",
    "metrics",
];

fn kep_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kep")
}

/// Each heading's title (without `#`s and `(Optional)`) and the text below it up to the next heading.
fn sections(readme: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_code = false;
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        match line.strip_prefix('#').filter(|_| !in_code) {
            Some(heading) => {
                let title = heading.trim_start_matches('#').trim();
                let title = title.trim_end_matches("(Optional)").trim();
                out.push((title.to_string(), String::new()));
            }
            None => {
                if let Some((_, body)) = out.last_mut() {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    out
}

#[test]
fn every_kep_has_every_template_section_filled_and_a_complete_kep_yaml() {
    let mut keps = 0;
    for entry in std::fs::read_dir(kep_dir()).unwrap().flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        keps += 1;
        let name = dir.display().to_string();
        let readme = std::fs::read_to_string(dir.join("README.md")).expect("a README.md");
        assert!(!readme.contains("TBD"), "{name}: TBD");
        let found = sections(&readme);
        let mut at = 0;
        for section in SECTIONS {
            let index = found[at..]
                .iter()
                .position(|(title, _)| title == section)
                .unwrap_or_else(|| {
                    panic!("{name}: no section {section:?} after {:?}", found.get(at))
                });
            at += index;
            // A section with no text of its own must at least lead into sub-sections.
            let (_, body) = &found[at];
            let leads = found.get(at + 1).is_some();
            assert!(
                !body.trim().is_empty() || leads,
                "{name}: section {section:?} is empty"
            );
        }
        let text = std::fs::read_to_string(dir.join("kep.yaml")).expect("a kep.yaml");
        let yaml: serde_json::Value = serde_saphyr::from_str(&text).expect("kep.yaml parses");
        for field in FIELDS {
            let value = &yaml[field];
            assert!(
                !value.is_null() && value != "" && value.as_array().is_none_or(|a| !a.is_empty()),
                "{name}: kep.yaml has no {field}"
            );
        }
        assert_eq!(yaml["status"], "provisional", "{name}");
    }
    assert!(keps >= 2, "the KEPs are directories under kep/");
}

#[test]
fn the_kep_index_links_every_document_and_every_link_resolves() {
    let root = kep_dir();
    let index = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut documents = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap().flatten() {
        let path = entry.path();
        match path.is_dir() {
            true => documents.push(path.join("README.md")),
            false if path.file_name().is_some_and(|n| n != "README.md") => documents.push(path),
            false => {}
        }
    }
    for document in &documents {
        let relative = document.strip_prefix(&root).unwrap().display().to_string();
        let linked = relative.trim_end_matches("/README.md");
        assert!(
            index.contains(&format!("({relative})")) || index.contains(&format!("({linked}/)")),
            "kep/README.md links {relative}"
        );
    }
    documents.push(root.join("README.md"));
    for document in documents {
        let text = std::fs::read_to_string(&document).unwrap();
        for target in text
            .split("](")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
        {
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let resolved = document.parent().unwrap().join(target);
            assert!(
                resolved.exists(),
                "{}: link {target} does not resolve",
                document.display()
            );
        }
    }
}
