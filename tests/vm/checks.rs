//! Checks every boot must pass, whatever the scenario: no failed units (beyond those the
//! scenario expects to fail), no kernel panic, no emergency or rescue mode, no ordering cycle.
//! Applied to the live guest (via the agent) and to journals read back from the saved disk.

use anyhow::{ensure, Result};

/// Journal or console lines that mean a broken boot, whatever the scenario.
const FATAL: &[&str] = &[
    "Kernel panic",
    "ordering cycle",
    "Entering emergency mode",
    "You are in emergency mode",
    "You are in rescue mode",
    "Cannot open access to console",
];

/// The fatal lines in `text`.
pub fn fatal_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| FATAL.iter().any(|f| l.contains(f)))
        .collect()
}

/// Units the journal says failed (`<unit>: Failed with result …`).
pub fn failed_units(journal: &str) -> Vec<String> {
    let mut units: Vec<String> = journal
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("]: ")?;
            let (unit, result) = rest.split_once(": ")?;
            result
                .starts_with("Failed with result")
                .then(|| unit.to_string())
        })
        .collect();
    units.sort();
    units.dedup();
    units
}

/// Checks one boot's journal text; `expected_failures` are units allowed to fail.
pub fn journal_ok(what: &str, journal: &str, expected_failures: &[&str]) -> Result<()> {
    let fatal = fatal_lines(journal);
    ensure!(
        fatal.is_empty(),
        "{what}: the journal shows a broken boot:\n{}",
        fatal.join("\n")
    );
    let failed: Vec<String> = failed_units(journal)
        .into_iter()
        .filter(|u| !expected_failures.contains(&u.as_str()))
        .collect();
    ensure!(failed.is_empty(), "{what}: units failed: {failed:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_failed_units_and_fatal_lines() {
        let journal = "[   26.7] systemd[1]: pivot.service: Failed with result 'exit-code'.\n\
                       [   27.0] systemd[1]: Found ordering cycle on kubelet.service/start\n";
        assert_eq!(failed_units(journal), vec!["pivot.service".to_string()]);
        assert_eq!(fatal_lines(journal).len(), 1);
        assert!(journal_ok("boot", journal, &["pivot.service"]).is_err());
    }
}
