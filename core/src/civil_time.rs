//! UTC calendar fields of unix seconds, for the few places that print a date without a date
//! crate (SigV4's `X-Amz-Date`, the test harness's RFC 3339 stamps).

/// A moment in UTC, split into calendar fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    /// The year (proleptic Gregorian).
    pub year: i64,
    /// 1–12.
    pub month: i64,
    /// 1–31.
    pub day: i64,
    /// 0–23.
    pub hour: i64,
    /// 0–59.
    pub minute: i64,
    /// 0–59 (no leap seconds: unix time has none).
    pub second: i64,
}

impl CivilTime {
    /// The UTC calendar fields of `unix` seconds since 1970-01-01T00:00:00Z (negative: before).
    pub fn from_unix(unix: i64) -> Self {
        let (days, seconds) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
        // Howard Hinnant's civil_from_days.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        Self {
            year,
            month,
            day,
            hour: seconds / 3_600,
            minute: seconds % 3_600 / 60,
            second: seconds % 60,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CivilTime;

    #[test]
    fn calendar_fields_of_unix_seconds() {
        let cases = [
            (0, (1970, 1, 1, 0, 0, 0)),
            (-1, (1969, 12, 31, 23, 59, 59)),
            (951_782_400, (2000, 2, 29, 0, 0, 0)),
            (1_440_938_160, (2015, 8, 30, 12, 36, 0)),
            (4_102_444_799, (2099, 12, 31, 23, 59, 59)),
        ];
        for (unix, (year, month, day, hour, minute, second)) in cases {
            let expected = CivilTime {
                year,
                month,
                day,
                hour,
                minute,
                second,
            };
            assert_eq!(CivilTime::from_unix(unix), expected, "{unix}");
        }
    }
}
