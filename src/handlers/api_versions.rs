//! ApiVersionsResponse (API key 18) v0-v5: clamp advertised versions (v5,
//! KIP-1242, changes only the request: the response layout is v4's).
//!
//! Clients pick the highest version both sides support; for the APIs the
//! proxy decodes, that must not exceed what the proxy can parse, or a broker
//! advertising (say) Fetch v19 would make responses undecodable. Only the
//! `max_version` of the listed keys is lowered; every other key, unknown
//! ones included (Confluent Cloud advertises 10000), and every other byte
//! (throttle time, supported/finalized features tags) is copied verbatim.
//!
//! Layout: `error_code: i16`, `api_keys: [api_key: i16, min_version: i16,
//! max_version: i16, tags (v3+)]`, `throttle_time_ms: i32 (v1+)`, tags (v3+).
//! v5 (Kafka 4.4, KIP-1242) only adds ClusterId and NodeId to the request
//! (and the REBOOTSTRAP_REQUIRED error); its response body is v4's. Kafka's
//! Java client and franz-go open every connection with v5, so refusing it
//! closed all their connections.
//! The response header is always v0, and a broker that does not support the
//! requested version answers with a v0 body carrying UNSUPPORTED_VERSION:
//! like Kafka's own client, parsing falls back to v0 when the requested
//! version does not parse (here only if that v0 body carries an error, so a
//! truncated success response is never reinterpreted).

use super::check_version;
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireResult, Writer};

/// One entry of the api_keys array, with its byte range.
struct Entry {
    api_key: i16,
    min: i16,
    max: i16,
    start: usize,
    end: usize,
}

/// Parses the body at `version`, passing each entry to `each`; returns the
/// top-level error code and the byte range of the array length prefix.
fn parse(
    version: i16,
    body: &[u8],
    mut each: impl FnMut(Entry),
) -> WireResult<(i16, std::ops::Range<usize>)> {
    let flexible = api::is_flexible(api::API_VERSIONS, version);
    let mut r = Reader::new(body);
    let error_code = r.read_i16("ApiVersionsResponse.error_code")?;
    let len_start = r.position();
    let n = r.read_array_len_v(
        flexible,
        if flexible { 7 } else { 6 },
        "ApiVersionsResponse.api_keys",
    )?;
    let len_end = r.position();
    for _ in 0..n {
        let start = r.position();
        let api_key = r.read_i16("ApiVersionsResponse.api_keys.api_key")?;
        let min = r.read_i16("ApiVersionsResponse.api_keys.min_version")?;
        let max = r.read_i16("ApiVersionsResponse.api_keys.max_version")?;
        r.skip_tagged_fields_v(flexible, "ApiVersionsResponse.api_keys._tagged_fields")?;
        each(Entry {
            api_key,
            min,
            max,
            start,
            end: r.position(),
        });
    }
    if version >= 1 {
        r.read_i32("ApiVersionsResponse.throttle_time_ms")?;
    }
    r.skip_tagged_fields_v(flexible, "ApiVersionsResponse._tagged_fields")?;
    Ok((error_code, len_start..len_end))
}

/// The highest version of an API the proxy can parse, as given in a clamp
/// table: either the maximum itself or a version range (as in
/// [`DECODED_VERSIONS`](super::DECODED_VERSIONS)).
pub trait MaxVersion {
    /// The highest parseable version.
    fn max_version(&self) -> i16;
}

impl MaxVersion for i16 {
    fn max_version(&self) -> i16 {
        *self
    }
}

impl MaxVersion for std::ops::RangeInclusive<i16> {
    fn max_version(&self) -> i16 {
        *self.end()
    }
}

/// Clamps an ApiVersionsResponse body: for each `(api_key, max)` in `table`
/// (`max` an `i16` or a version range),
/// an advertised `max_version` above `max` is lowered to `max`. An entry
/// whose `min_version` is already above `max` cannot be used through the
/// proxy at all and is removed (the array length is rewritten).
///
/// Returns `Ok(None)` when nothing changed.
pub fn clamp_api_versions_response<M: MaxVersion>(
    version: i16,
    body: &[u8],
    table: &[(i16, M)],
) -> WireResult<Option<Vec<u8>>> {
    clamp(version, body, table, true)
}

/// Like [`clamp_api_versions_response`], for preferred rather than required
/// maxima: an entry whose `min_version` is above the preferred maximum is
/// left as advertised (a client must still be able to use the API; it then
/// uses a version the proxy handles the slow way), never removed.
pub fn prefer_api_versions_response(
    version: i16,
    body: &[u8],
    table: &[(i16, i16)],
) -> WireResult<Option<Vec<u8>>> {
    clamp(version, body, table, false)
}

/// The clamp; `remove_unusable`: whether an entry whose `min_version` is
/// above the limit is removed (else it is kept unchanged).
fn clamp<M: MaxVersion>(
    version: i16,
    body: &[u8],
    table: &[(i16, M)],
    remove_unusable: bool,
) -> WireResult<Option<Vec<u8>>> {
    check_version("ApiVersionsResponse", version, 0..=5)?;
    let limit = |key: i16| {
        table
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, m)| m.max_version())
    };
    // First pass: validate, and count entries to remove (their count goes in
    // the length prefix, which precedes them).
    let tally = |v: i16| -> WireResult<(i16, usize, usize)> {
        let (mut count, mut removed) = (0usize, 0usize);
        let (error_code, _) = parse(v, body, |e: Entry| {
            count += 1;
            if remove_unusable && limit(e.api_key).is_some_and(|m| e.min > m) {
                removed += 1;
            }
        })?;
        Ok((error_code, count, removed))
    };
    let (version, count, removed) = match tally(version) {
        Ok((_, c, r)) => (version, c, r),
        // Only an error response may fall back to v0: a truncated success
        // response must not be reinterpreted as an older version.
        Err(e) if version > 0 => match tally(0) {
            Ok((code, c, r)) if code != 0 => (0, c, r),
            _ => return Err(e),
        },
        Err(e) => return Err(e),
    };
    let flexible = api::is_flexible(api::API_VERSIONS, version);
    let mut sp = Splicer::new(body);
    let mut err = None;
    let (_, len_range) = parse(version, body, |e| {
        let Some(m) = limit(e.api_key) else { return };
        let res = if e.min > m {
            if remove_unusable {
                sp.replace(e.start, e.end, &[])
            } else {
                Ok(())
            }
        } else if e.max > m {
            // max_version sits 4 bytes into the entry.
            sp.replace(e.start + 4, e.start + 6, &m.to_be_bytes())
        } else {
            Ok(())
        };
        if let Err(x) = res {
            err.get_or_insert(x);
        }
    })?;
    if let Some(e) = err {
        return Err(e);
    }
    if removed == 0 {
        return Ok(sp.finish());
    }
    // Entries were removed: splice a new length prefix in front of the
    // already spliced tail.
    let Some(out) = sp.finish() else {
        return Ok(None);
    };
    let mut w = Writer::new(Vec::with_capacity(out.len()));
    w.put_raw(&body[..len_range.start]);
    w.put_array_len_v(
        flexible,
        Some(count - removed),
        "ApiVersionsResponse.api_keys",
    )?;
    let mut v = w.into_inner();
    v.extend_from_slice(out.get(len_range.end..).unwrap_or_default());
    Ok(Some(v))
}

/// Sets the `(api_key, min_version, max_version)` entries of `set` in an
/// ApiVersionsResponse body: an advertised entry of one of these keys gets
/// these versions, and with `add_missing` a key the body lacks is appended
/// (an API the proxy answers itself, such as SASL on a mirror listener).
/// Error responses are left alone. Returns `Ok(None)` when nothing changed.
pub fn set_api_versions(
    version: i16,
    body: &[u8],
    set: &[(i16, i16, i16)],
    add_missing: bool,
) -> WireResult<Option<Vec<u8>>> {
    check_version("ApiVersionsResponse", version, 0..=5)?;
    let mut entries = Vec::new();
    let mut end = 0;
    let parsed = parse(version, body, |e| {
        entries.push((e.api_key, e.start));
        end = end.max(e.end);
    });
    let (code, len_range) = match parsed {
        Ok(r) => r,
        Err(e) => {
            // An UNSUPPORTED_VERSION answer comes as a v0 body: nothing to set.
            return match parse(0, body, |_| {}) {
                Ok((code, _)) if code != 0 && version > 0 => Ok(None),
                _ => Err(e),
            };
        }
    };
    if code != 0 {
        return Ok(None);
    }
    let mut out = body.to_vec();
    let mut changed = false;
    for (key, start) in &entries {
        if let Some((_, min, max)) = set.iter().find(|(k, _, _)| k == key) {
            let mut v = [0u8; 4];
            v[..2].copy_from_slice(&min.to_be_bytes());
            v[2..].copy_from_slice(&max.to_be_bytes());
            if out[start + 2..start + 6] != v {
                out[start + 2..start + 6].copy_from_slice(&v);
                changed = true;
            }
        }
    }
    let missing: Vec<_> = set
        .iter()
        .filter(|(k, _, _)| add_missing && !entries.iter().any(|(key, _)| key == k))
        .collect();
    if missing.is_empty() {
        return Ok(changed.then_some(out));
    }
    let flexible = api::is_flexible(api::API_VERSIONS, version);
    // The array ends after its last entry (or its length prefix).
    let end = end.max(len_range.end);
    let mut w = Writer::new(Vec::with_capacity(out.len() + 7 * missing.len() + 4));
    w.put_raw(&out[..len_range.start]);
    w.put_array_len_v(
        flexible,
        Some(entries.len() + missing.len()),
        "ApiVersionsResponse.api_keys",
    )?;
    w.put_raw(&out[len_range.end..end]);
    for (k, min, max) in missing {
        w.put_i16(*k);
        w.put_i16(*min);
        w.put_i16(*max);
        if flexible {
            w.put_uvarint(0);
        }
    }
    w.put_raw(&out[end..]);
    Ok(Some(w.into_inner()))
}
