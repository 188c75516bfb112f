//! HTTP content codings: the request's `Content-Encoding`, the response's `Accept-Encoding`
//! negotiation, and bounded gzip/deflate (zlib) (de)compression.
//!
//! Decompression never trusts a claimed size: output grows as it is produced and stops one byte
//! past the limit, so a small "gzip bomb" costs at most the limit in memory. Like Triton (zlib's
//! automatic header detection), either coding accepts gzip- or zlib-framed data.

use std::io::{Read, Write};

use axum::http::HeaderMap;
use axum::http::header::{ACCEPT_ENCODING, CONTENT_ENCODING};
use bytes::Bytes;
use flate2::Compression;
use flate2::read::{GzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};

use super::error::HttpError;
use nereid_proto::{ServiceError, ServiceResult};

/// A content coding this server reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Deflate,
}

impl Encoding {
    /// The `Content-Encoding` header value; `None` for identity.
    pub fn header_value(self) -> Option<&'static str> {
        match self {
            Encoding::Identity => None,
            Encoding::Gzip => Some("gzip"),
            Encoding::Deflate => Some("deflate"),
        }
    }

    fn from_token(token: &str) -> Option<Encoding> {
        match token.to_ascii_lowercase().as_str() {
            "" | "identity" => Some(Encoding::Identity),
            "gzip" => Some(Encoding::Gzip),
            "deflate" => Some(Encoding::Deflate),
            _ => None,
        }
    }
}

/// The coding of the request body; anything but gzip, deflate or identity is 501 with
/// `Accept-Encoding: gzip, deflate`, as Triton answers.
pub fn request_encoding(headers: &HeaderMap) -> Result<Encoding, HttpError> {
    let Some(value) = headers.get(CONTENT_ENCODING) else {
        return Ok(Encoding::Identity);
    };
    let text = value.to_str().unwrap_or("<non-ASCII>").trim();
    Encoding::from_token(text).ok_or_else(|| {
        HttpError::from(ServiceError::unsupported(format!(
            "unsupported Content-Encoding '{text}'; supported codings are gzip, deflate and identity"
        )))
        .with_header(ACCEPT_ENCODING, "gzip, deflate")
    })
}

/// The coding for the response, from `Accept-Encoding`: the highest q-value among identity,
/// gzip and deflate wins, the first listed on a tie; malformed entries and q=0 are skipped;
/// identity when nothing acceptable is listed (Triton's `CompressionTypeUsed`).
pub fn response_encoding(headers: &HeaderMap) -> Encoding {
    let Some(accept) = headers.get(ACCEPT_ENCODING).and_then(|v| v.to_str().ok()) else {
        return Encoding::Identity;
    };
    let mut best = Encoding::Identity;
    let mut best_weight = 0.0f64;
    for entry in accept.split(',') {
        let mut parts = entry.split(';');
        let coding = parts.next().unwrap_or("").trim();
        let mut weight = 1.0f64;
        for param in parts {
            if let Some(q) = param.trim().strip_prefix("q=") {
                weight = q.trim().parse().unwrap_or(0.0);
            }
        }
        if coding.is_empty() || coding == "*" {
            continue;
        }
        if let Some(encoding) = Encoding::from_token(coding)
            && weight > best_weight
        {
            best = encoding;
            best_weight = weight;
        }
    }
    best
}

/// Decompresses a request body, failing once the output would exceed `limit` bytes.
pub fn decompress(encoding: Encoding, data: &[u8], limit: usize) -> ServiceResult<Bytes> {
    let reader: Box<dyn Read + '_> = match encoding {
        Encoding::Identity => return Ok(Bytes::copy_from_slice(data)),
        Encoding::Gzip | Encoding::Deflate if data.starts_with(&[0x1f, 0x8b]) => {
            Box::new(GzDecoder::new(data))
        }
        Encoding::Gzip | Encoding::Deflate => Box::new(ZlibDecoder::new(data)),
    };
    let bound = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::with_capacity(data.len().saturating_mul(4).min(limit));
    reader.take(bound).read_to_end(&mut out).map_err(|e| {
        ServiceError::invalid(format!(
            "failed to decompress the request body ({}): {e}",
            encoding.header_value().unwrap_or("identity")
        ))
    })?;
    if out.len() > limit {
        return Err(ServiceError::invalid(format!(
            "decompressed {}",
            super::body::too_large_message(limit)
        )));
    }
    Ok(Bytes::from(out))
}

/// Compresses response chunks into one body.
pub fn compress(encoding: Encoding, chunks: &[Bytes]) -> std::io::Result<Bytes> {
    fn write_all<W: Write>(mut writer: W, chunks: &[Bytes]) -> std::io::Result<W> {
        for chunk in chunks {
            writer.write_all(chunk)?;
        }
        Ok(writer)
    }
    let out = match encoding {
        Encoding::Identity => chunks.concat(),
        Encoding::Gzip => {
            write_all(GzEncoder::new(Vec::new(), Compression::default()), chunks)?.finish()?
        }
        Encoding::Deflate => {
            write_all(ZlibEncoder::new(Vec::new(), Compression::default()), chunks)?.finish()?
        }
    };
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn accept(value: &str) -> Encoding {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_str(value).unwrap());
        response_encoding(&headers)
    }

    #[test]
    fn accept_encoding_negotiation() {
        assert_eq!(response_encoding(&HeaderMap::new()), Encoding::Identity);
        assert_eq!(accept("gzip"), Encoding::Gzip);
        assert_eq!(accept("deflate, gzip"), Encoding::Deflate);
        assert_eq!(accept("gzip;q=0.5, deflate;q=0.8"), Encoding::Deflate);
        assert_eq!(accept("identity;q=0.9, gzip;q=0.1"), Encoding::Identity);
        assert_eq!(accept("br, gzip;q=0.3"), Encoding::Gzip);
        assert_eq!(accept("gzip;q=0"), Encoding::Identity);
        assert_eq!(accept("gzip;q=abc, deflate"), Encoding::Deflate);
        assert_eq!(accept("br"), Encoding::Identity);
    }

    #[test]
    fn request_encoding_refuses_unknown_codings() {
        let mut headers = HeaderMap::new();
        assert_eq!(request_encoding(&headers).unwrap(), Encoding::Identity);
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("GZIP"));
        assert_eq!(request_encoding(&headers).unwrap(), Encoding::Gzip);
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("br"));
        let err = request_encoding(&headers).unwrap_err();
        assert_eq!(err.status().as_u16(), 501);
        assert!(err.message().contains("'br'"));
    }

    #[test]
    fn round_trip_and_bounds() {
        let data = Bytes::from(vec![7u8; 10_000]);
        for encoding in [Encoding::Gzip, Encoding::Deflate] {
            let packed = compress(encoding, &[data.slice(..4000), data.slice(4000..)]).unwrap();
            assert!(packed.len() < 1000);
            assert_eq!(decompress(encoding, &packed, 10_000).unwrap(), data);
            let err = decompress(encoding, &packed, 9_999).unwrap_err();
            assert!(
                err.message()
                    .contains("exceeds the maximum allowed input size of 9999 bytes")
            );
        }
        // gzip data sent as "deflate" is accepted, like zlib's auto-detection in Triton.
        let gz = compress(Encoding::Gzip, std::slice::from_ref(&data)).unwrap();
        assert_eq!(decompress(Encoding::Deflate, &gz, 10_000).unwrap(), data);
        let err = decompress(Encoding::Gzip, b"not compressed", 100).unwrap_err();
        assert!(
            err.message()
                .starts_with("failed to decompress the request body (gzip)")
        );
    }
}
