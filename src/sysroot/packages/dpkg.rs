//! dpkg's status file (RFC 822 stanzas; a package counts when its `Status` says `installed`,
//! as `dpkg-query -W` with `${db:Status-Status}` shows) and dpkg's version order (Debian
//! Policy 5.6.12: epoch, then upstream version and revision, each by alternating non-digit
//! runs, where `~` sorts before everything and letters before other characters, and digit
//! runs compared as numbers).

use std::cmp::Ordering;

use super::Package;

/// The installed packages a status file lists.
pub(super) fn parse_status(text: &str) -> Vec<Package> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let mut name = None;
        let mut version = None;
        let mut arch = None;
        let mut installed = false;
        for line in stanza.lines() {
            if line.starts_with([' ', '\t']) {
                continue;
            }
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match key {
                "Package" => name = Some(value.to_string()),
                "Version" => version = Some(value.to_string()),
                "Architecture" => arch = Some(value.to_string()),
                "Status" => installed = value.split_whitespace().nth(2) == Some("installed"),
                _ => {}
            }
        }
        if let (true, Some(name), Some(version)) = (installed, name, version) {
            out.push(Package {
                name,
                version,
                arch: arch.unwrap_or_default(),
            });
        }
    }
    out
}

/// dpkg's order of two versions (`dpkg --compare-versions`).
pub(super) fn compare_versions(a: &str, b: &str) -> Ordering {
    let split = |v: &str| {
        let (epoch, rest) = match v.split_once(':') {
            Some((e, rest)) => (e.parse::<u64>().unwrap_or(0), rest),
            None => (0, v),
        };
        let (upstream, revision) = rest.rsplit_once('-').unwrap_or((rest, ""));
        (epoch, upstream.to_string(), revision.to_string())
    };
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb)
        .then_with(|| verrevcmp(&ua, &ub))
        .then_with(|| verrevcmp(&ra, &rb))
}

/// The weight of one character of a non-digit run; 0 past the end.
fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(b'~') => -1,
        Some(c) => i32::from(c) + 256,
    }
}

fn verrevcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let digit = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !digit(a, i)) || (j < b.len() && !digit(b, j)) {
            let (ac, bc) = (order(a.get(i).copied()), order(b.get(j).copied()));
            if ac != bc {
                return ac.cmp(&bc);
            }
            i += 1;
            j += 1;
        }
        while a.get(i) == Some(&b'0') {
            i += 1;
        }
        while b.get(j) == Some(&b'0') {
            j += 1;
        }
        let mut first_diff = Ordering::Equal;
        while digit(a, i) && digit(b, j) {
            if first_diff == Ordering::Equal {
                first_diff = a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
        if digit(a, i) {
            return Ordering::Greater;
        }
        if digit(b, j) {
            return Ordering::Less;
        }
        if first_diff != Ordering::Equal {
            return first_diff;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each pair's order as `dpkg --compare-versions` (installed on every Debian machine) says.
    #[test]
    fn versions_order_as_dpkg_orders_them() {
        let pairs = [
            ("1.0", "1.0"), ("1.0", "1.1"), ("1.0-1", "1.0-2"), ("1:0.9", "1.0"),
            ("1.0~rc1", "1.0"), ("1.0~rc1-1", "1.0~~-1"), ("2.36.1-8", "2.36.1-8+deb12u1"),
            ("1.0a", "1.0"), ("1.0+b1", "1.0"), ("1.0.1", "1.0a"), ("7.88.1-10+deb12u5", "7.88.1-10+deb12u12"),
            ("0", "00"), ("1.2.3-4ubuntu1", "1.2.3-4"), ("252.30-1~deb12u2", "252.31-1~deb12u1"),
            ("1:2.3", "1:2.3-0"), ("a", "B"), ("1.0-1", "1.0"),
        ];
        let dpkg_says = |a: &str, b: &str| {
            for (op, order) in [("lt", Ordering::Less), ("eq", Ordering::Equal), ("gt", Ordering::Greater)] {
                let status = std::process::Command::new("dpkg")
                    .args(["--compare-versions", a, op, b])
                    .status()
                    .expect("dpkg");
                if status.success() {
                    return order;
                }
            }
            panic!("dpkg has no order for {a} {b}");
        };
        for (a, b) in pairs {
            assert_eq!(compare_versions(a, b), dpkg_says(a, b), "{a} vs {b}");
            assert_eq!(compare_versions(b, a), dpkg_says(b, a), "{b} vs {a}");
        }
    }

    #[test]
    fn only_installed_packages_count() {
        let text = "Package: a\nStatus: install ok installed\nVersion: 1.0\nArchitecture: amd64\nDescription: x\n more\n\n\
                    Package: b\nStatus: deinstall ok config-files\nVersion: 2\nArchitecture: amd64\n\n\
                    Package: c\nStatus: hold ok installed\nArchitecture: all\nVersion: 3\n";
        let list = parse_status(text);
        let names: Vec<_> = list.iter().map(|p| (p.name.as_str(), p.version.as_str(), p.arch.as_str())).collect();
        assert_eq!(names, [("a", "1.0", "amd64"), ("c", "3", "all")]);
    }
}
