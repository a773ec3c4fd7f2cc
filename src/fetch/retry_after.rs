//! The `Retry-After` header (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date in any of the
//! three formats a recipient must accept (IMF-fixdate, RFC 850, asctime). A date in the past is
//! no wait; a value that is neither is ignored (the client's own backoff applies).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long `value` asks to wait, counted from `now`.
pub fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Absurdly long waits saturate; the retry budget decides what to do with them.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    // A moment this system's clock cannot name is as far off as a wait can be.
    let Some(at) = UNIX_EPOCH.checked_add(Duration::from_secs(http_date(value)?)) else {
        return Some(Duration::MAX);
    };
    Some(at.duration_since(now).unwrap_or_default())
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Seconds since the epoch of an HTTP-date.
fn http_date(value: &str) -> Option<u64> {
    let (_weekday, rest) = value.split_once([',', ' '])?;
    let parts: Vec<&str> = rest.split_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
        [day, month, year, time, "GMT"] => (*day, *month, year.parse().ok()?, *time),
        // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"; two-digit years within 50 years of now
        // are what RFC 9110 asks for: 70–99 are the 1900s, the rest the 2000s.
        [date, time, "GMT"] => {
            let mut fields = date.split('-');
            let (day, month, year) = (fields.next()?, fields.next()?, fields.next()?);
            let year: u64 = year.parse().ok()?;
            (day, month, if year < 70 { 2000 + year } else { 1900 + year }, *time)
        }
        // asctime: "Sun Nov  6 08:49:37 1994"
        [month, day, time, year] => (*day, *month, year.parse().ok()?, *time),
        _ => return None,
    };
    let day: u64 = day.parse().ok()?;
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    let mut hms = time.split(':').map(|f| f.parse::<u64>().ok());
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    // Years have four digits (two in RFC 850's format): a longer one is no date, and would
    // overflow the day count.
    if hms.next().is_some()
        || !(1..=31).contains(&day)
        || h > 23
        || m > 59
        || s > 60
        || !(1970..=9999).contains(&year)
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian calendar (H. Hinnant's
/// algorithm, for years from 1970 on).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1994-11-06T08:49:37Z, RFC 9110's example date.
    const EXAMPLE: u64 = 784_111_777;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn delay_seconds() {
        assert_eq!(parse("120", at(0)), Some(Duration::from_secs(120)));
        assert_eq!(parse(" 0 ", at(0)), Some(Duration::ZERO));
        assert_eq!(
            parse("99999999999999999999999", at(0)),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn the_three_date_formats_name_the_same_moment() {
        let now = at(EXAMPLE - 30);
        for value in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(parse(value, now), Some(Duration::from_secs(30)), "{value}");
        }
    }

    #[test]
    fn a_date_in_the_past_is_no_wait() {
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT", at(EXAMPLE + 5)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn anything_else_is_ignored() {
        for value in [
            "",
            "-5",
            "1.5",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 CET",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 99999999999999 08:49:37 GMT",
            "Sun Nov  6 08:49:37 18446744073709551615",
        ] {
            assert_eq!(parse(value, at(0)), None, "{value:?}");
        }
    }

    #[test]
    fn dates_agree_with_the_calendar() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(
            http_date("Sun, 06 Dec 2026 05:53:51 GMT"),
            Some(1_796_536_431)
        );
    }
}
