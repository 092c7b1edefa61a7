//! A real S3-compatible server for the tests: moto's server mode
//! (`$GPUTEL_S3_SERVER`, which scripts/test installs) on loopback, with the
//! few S3 calls the tests make themselves (plain HTTP, a dummy signature:
//! moto checks none, but refuses anonymous reads of private objects).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{Running, provided_path};

/// The S3 server command: `$GPUTEL_S3_SERVER`; under CI a missing one
/// fails the test, elsewhere it is skipped (None).
pub fn s3_server_bin() -> Option<PathBuf> {
    provided_path(
        "GPUTEL_S3_SERVER",
        "scripts/test installs moto[server] and sets it",
    )
}

/// The environment an S3 client of the test server needs (its endpoint is
/// given by flag or `AWS_ENDPOINT_URL` where the client needs it).
pub fn s3_env(cmd: &mut Command) -> &mut Command {
    cmd.env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_SESSION_TOKEN")
}

/// A running S3 server on 127.0.0.1, killed when dropped.
#[derive(Debug)]
pub struct S3 {
    _server: Running,
    port: u16,
}

impl S3 {
    /// Starts the server on `port` and waits (at most 60 s) until a listing
    /// of buckets answers 200.
    pub fn start(bin: &Path, port: u16) -> S3 {
        let mut cmd = Command::new(bin);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let s3 = S3 {
            _server: Running::spawn(cmd),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(s3.try_request("GET", "/"), Ok((200, _))) {
            assert!(
                Instant::now() < deadline,
                "the S3 server on port {port} did not answer within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s3
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One HTTP/1.0 request: the status and the body.
    pub fn try_request(&self, method: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.port))?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            conn,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, \
             SignedHeaders=host, Signature=0\r\n\r\n",
            self.port
        )?;
        let mut response = Vec::new();
        conn.read_to_end(&mut response)?;
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no end of headers"))?;
        let head = String::from_utf8_lossy(&response[..split]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
        Ok((status, response[split + 4..].to_vec()))
    }

    /// One request that must answer 200: its body.
    pub fn request(&self, method: &str, path: &str) -> Vec<u8> {
        let (status, body) = self
            .try_request(method, path)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(
            status,
            200,
            "{method} {path}: {}",
            String::from_utf8_lossy(&body)
        );
        body
    }

    pub fn create_bucket(&self, bucket: &str) {
        self.request("PUT", &format!("/{bucket}"));
    }

    /// Every key in `bucket` under `prefix` (ListObjectsV2, all pages).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut path = format!("/{bucket}?list-type=2&prefix={prefix}");
            if let Some(t) = &token {
                path.push_str(&format!("&continuation-token={t}"));
            }
            let body = String::from_utf8(self.request("GET", &path)).expect("utf-8 listing");
            keys.extend(between_all(&body, "<Key>", "</Key>"));
            token = between_all(&body, "<NextContinuationToken>", "</NextContinuationToken>")
                .into_iter()
                .next();
            if token.is_none() {
                return keys;
            }
        }
    }

    /// Downloads every object of `bucket` under `prefix` into `dir`, by the
    /// key's path below the prefix; returns the keys.
    pub fn download(&self, bucket: &str, prefix: &str, dir: &Path) -> Vec<String> {
        let keys = self.keys(bucket, prefix);
        for key in &keys {
            let rel = key.strip_prefix(prefix).expect("listed under the prefix");
            let file = dir.join(rel.trim_start_matches('/'));
            std::fs::create_dir_all(file.parent().expect("a parent"))
                .expect("create a download directory");
            let body = self.request("GET", &format!("/{bucket}/{}", key.replace('=', "%3D")));
            std::fs::write(&file, body).expect("write a downloaded file");
        }
        keys
    }
}

fn between_all(text: &str, open: &str, close: &str) -> Vec<String> {
    text.split(open)
        .skip(1)
        .filter_map(|rest| rest.split_once(close).map(|(v, _)| v.to_owned()))
        .collect()
}
