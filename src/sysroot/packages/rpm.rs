//! rpm-ostree's package list (`rpmostree.rpmdb.pkglist`: `a(sssss)`, name, epoch, version,
//! release, arch per package) and rpm's version order (`rpmvercmp`, written from rpm's
//! documented rules: alphanumeric segments, numbers newer than letters, `~` older than
//! anything, `^` newer than the end of the string but older than more segments).

use std::cmp::Ordering;

use anyhow::Result;
use ostree::glib;

use super::{Package, RPM_PKGLIST};

/// The package list in a commit's metadata, if it has one.
pub(super) fn pkglist(commit: &glib::Variant) -> Result<Option<Vec<Package>>> {
    let metadata = glib::VariantDict::new(Some(&commit.child_value(0)));
    let Some(list) = metadata.lookup_value(RPM_PKGLIST, None) else {
        return Ok(None);
    };
    let Some(entries) = list.get::<Vec<(String, String, String, String, String)>>() else {
        anyhow::bail!(
            "{RPM_PKGLIST} is a {}, not rpm-ostree's a(sssss)",
            list.type_()
        );
    };
    Ok(Some(
        entries
            .into_iter()
            .map(|(name, epoch, version, release, arch)| Package {
                name,
                version: match epoch.as_str() {
                    "" | "0" => format!("{version}-{release}"),
                    _ => format!("{epoch}:{version}-{release}"),
                },
                arch,
            })
            .collect(),
    ))
}

/// `[epoch:]version[-release]` against another: epoch (a missing one is 0), then version, then
/// release, each by [`rpmvercmp`].
pub(super) fn compare_evr(a: &str, b: &str) -> Ordering {
    let split = |s: &str| {
        let (epoch, rest) = match s.split_once(':') {
            Some((e, rest)) if e.bytes().all(|b| b.is_ascii_digit()) => (e.parse().unwrap_or(0u64), rest),
            _ => (0, s),
        };
        let (version, release) = rest.rsplit_once('-').unwrap_or((rest, ""));
        (epoch, version.to_string(), release.to_string())
    };
    let (ea, va, ra) = split(a);
    let (eb, vb, rb) = split(b);
    ea.cmp(&eb)
        .then_with(|| rpmvercmp(&va, &vb))
        .then_with(|| rpmvercmp(&ra, &rb))
}

/// rpm's comparison of two version (or release) strings.
pub(super) fn rpmvercmp(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let separator = |c: u8| !c.is_ascii_alphanumeric() && c != b'~' && c != b'^';
    while i < a.len() || j < b.len() {
        while i < a.len() && separator(a[i]) {
            i += 1;
        }
        while j < b.len() && separator(b[j]) {
            j += 1;
        }
        let (ca, cb) = (a.get(i).copied(), b.get(j).copied());
        if ca == Some(b'~') || cb == Some(b'~') {
            if ca != Some(b'~') {
                return Ordering::Greater;
            }
            if cb != Some(b'~') {
                return Ordering::Less;
            }
            i += 1;
            j += 1;
            continue;
        }
        if ca == Some(b'^') || cb == Some(b'^') {
            if ca.is_none() {
                return Ordering::Less;
            }
            if cb.is_none() {
                return Ordering::Greater;
            }
            if ca != Some(b'^') {
                return Ordering::Greater;
            }
            if cb != Some(b'^') {
                return Ordering::Less;
            }
            i += 1;
            j += 1;
            continue;
        }
        let (Some(ca), Some(_)) = (ca, cb) else {
            break;
        };
        let numeric = ca.is_ascii_digit();
        let (sa, sb) = (segment(a, i, numeric), segment(b, j, numeric));
        i += sa.len();
        j += sb.len();
        if sb.is_empty() {
            return match numeric {
                true => Ordering::Greater,
                false => Ordering::Less,
            };
        }
        let order = match numeric {
            true => {
                let trim = |s: &[u8]| {
                    let zeros = s.iter().take_while(|c| **c == b'0').count();
                    s[zeros..].to_vec()
                };
                let (ta, tb) = (trim(sa), trim(sb));
                ta.len().cmp(&tb.len()).then_with(|| ta.cmp(&tb))
            }
            false => sa.cmp(sb),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    match (i >= a.len(), j >= b.len()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        _ => Ordering::Greater,
    }
}

/// The digits (or letters) of `s` from `from` on.
fn segment(s: &[u8], from: usize, numeric: bool) -> &[u8] {
    let len = s[from..]
        .iter()
        .take_while(|c| match numeric {
            true => c.is_ascii_digit(),
            false => c.is_ascii_alphabetic(),
        })
        .count();
    &s[from..from + len]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs from rpm's own test suite's cases (rpmvercmp.at), and rpm's verdict on each, asked
    /// of the rpm installed here so the table cannot drift from it.
    #[test]
    fn versions_order_as_rpm_orders_them() {
        let pairs = [
            ("1.0", "1.0"), ("1.0", "2.0"), ("2.0.1", "2.0.1a"), ("5.5p1", "5.5p2"),
            ("5.5p10", "5.5p1"), ("10xyz", "10.1xyz"), ("xyz10", "xyz10.1"), ("1.0", "1.0a"),
            ("10.0001", "10.1"), ("10.0001", "10.0039"), ("4.999.9", "5.0"), ("20101121", "20101122"),
            ("2_0", "2_0"), ("2.0", "2_0"), ("a", "b"), ("1.0~rc1", "1.0"), ("1.0~rc1", "1.0~rc2"),
            ("1.0~rc1~git123", "1.0~rc1"), ("1.0^", "1.0"), ("1.0^git1", "1.0"),
            ("1.0^git1", "1.0.1"), ("1.0^git1~pre", "1.0^git1"), ("1b.fc17", "1.fc17"),
            ("6.0.rc1", "6.0"), ("1.0a", "1.0.1"), ("+1", "1"),
        ];
        let rpm_says = |a: &str, b: &str| {
            let out = std::process::Command::new("rpm")
                .args(["--eval", &format!("%{{lua: print(rpm.vercmp('{a}', '{b}'))}}")])
                .output()
                .expect("rpm (a test dependency)");
            match String::from_utf8_lossy(&out.stdout).trim() {
                "-1" => Ordering::Less,
                "0" => Ordering::Equal,
                "1" => Ordering::Greater,
                other => panic!("rpm said {other:?} for {a} {b}"),
            }
        };
        for (a, b) in pairs {
            assert_eq!(rpmvercmp(a, b), rpm_says(a, b), "{a} vs {b}");
            assert_eq!(rpmvercmp(b, a), rpm_says(b, a), "{b} vs {a}");
        }
        assert_eq!(compare_evr("1:1.0-1", "2.0-1"), Ordering::Greater);
        assert_eq!(compare_evr("1.0-2.fc40", "1.0-10.fc40"), Ordering::Less);
    }
}
