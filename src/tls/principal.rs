//! A client certificate as a Kafka principal.
//!
//! Kafka's default principal builder names an mTLS client by its
//! certificate's subject in RFC 2253 form (Java's
//! `X500Principal.getName()`): the relative distinguished names last first,
//! joined by `,`, each `KEYWORD=value` (CN, C, L, ST, O, OU, STREET, DC,
//! UID; other attributes as their dotted OID and `#` hex of the DER value),
//! with `,+"\<>;` escaped. mirrorguard names it the same way, as
//! `User:CN=fetcher,O=Example`, so `fetcher_principals` are written as for
//! a Kafka ACL.

use x509_parser::prelude::{FromDer, X509Certificate};

fn keyword(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.9" => "STREET",
        "0.9.2342.19200300.100.1.25" => "DC",
        "0.9.2342.19200300.100.1.1" => "UID",
        _ => return None,
    })
}

fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `User:<subject in RFC 2253 form>` of a DER certificate, or `None` when
/// it cannot be parsed.
pub fn certificate_principal(der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let rdns: Vec<String> = cert
        .subject()
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|atv| {
                    let oid = atv.attr_type().to_id_string();
                    match (keyword(&oid), atv.as_str()) {
                        (Some(k), Ok(v)) => format!("{k}={}", escape(v)),
                        _ => {
                            let hex: String = atv
                                .attr_value()
                                .as_bytes()
                                .iter()
                                .map(|b| format!("{b:02x}"))
                                .collect();
                            format!("{oid}=#{hex}")
                        }
                    }
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    let name: Vec<&str> = rdns.iter().rev().map(String::as_str).collect();
    Some(format!("User:{}", name.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_read_as_kafka_names_them() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CountryName, "DE");
        dn.push(rcgen::DnType::OrganizationName, "Example, Inc");
        dn.push(rcgen::DnType::CommonName, "fetcher");
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            certificate_principal(cert.der()).as_deref(),
            Some("User:CN=fetcher,O=Example\\, Inc,C=DE")
        );
        assert_eq!(certificate_principal(b"not a certificate"), None);
        assert_eq!(escape(" #a "), "\\ #a\\ ");
    }
}
