//! The one thing mirrorguard reads from an X.509 certificate itself: its
//! notAfter, for `mirrorguard_tls_certificate_expiry_timestamp_seconds`.
//! A bounds-checked DER walk down to `tbsCertificate.validity` (RFC 5280
//! section 4.1); anything unexpected gives `None`, never a panic.

/// DER tag of a SEQUENCE.
const SEQUENCE: u8 = 0x30;
/// The `[0] EXPLICIT Version` of a v2/v3 certificate.
const VERSION: u8 = 0xA0;
/// UTCTime (YYMMDDHHMMSSZ) and GeneralizedTime (YYYYMMDDHHMMSSZ).
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element: (tag, contents, the rest after it).
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The notAfter of a DER certificate, in seconds since the Unix epoch.
pub fn not_after(cert: &[u8]) -> Option<i64> {
    let (tag, certificate, _) = element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = element(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == VERSION {
        rest = after;
    }
    // serialNumber, signature, issuer, then validity.
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (tag, validity, _) = element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (_, _, after_not_before) = element(validity)?;
    let (tag, time, _) = element(after_not_before)?;
    parse_time(tag, time)
}

fn parse_time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = |s: &[u8]| -> Option<i64> {
        s.iter().try_fold(0i64, |acc, b| {
            b.is_ascii_digit().then(|| acc * 10 + i64::from(b - b'0'))
        })
    };
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(&text[..2])?;
            // RFC 5280: 50..99 are 1950..1999, 00..49 are 2000..2049.
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        (GENERALIZED_TIME, 15) => (digits(&text[..4])?, &text[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let field = |i: usize| digits(&rest[i..i + 2]);
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_until(year: i32, month: u8, day: u8) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn not_after_of_utc_and_generalized_times() {
        // 2030-06-15T00:00:00Z (UTCTime) and 2051-01-02T00:00:00Z (GeneralizedTime).
        assert_eq!(not_after(&cert_until(2030, 6, 15)), Some(1_907_712_000));
        assert_eq!(not_after(&cert_until(2051, 1, 2)), Some(2_556_230_400));
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn garbage_and_truncations_give_none() {
        let good = cert_until(2030, 6, 15);
        for cut in 0..good.len() {
            // Any truncation either still parses (only the tail after validity
            // is gone) or gives None; never a panic.
            let _ = not_after(&good[..cut]);
        }
        assert_eq!(not_after(b""), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(parse_time(UTC_TIME, b"301332000000Z"), None);
    }
}
